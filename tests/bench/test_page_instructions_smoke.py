"""bench/page_instructions.py cannot rot: what it runs under valgrind requests each of its
pages from a (tiny) page_bench database, and it reads callgrind's count. valgrind itself is
not run here: one page costs minutes under it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from bench.page_instructions import PAGES, collected

pytestmark = pytest.mark.slow  # the benchmark as processes, on a database of its own

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_it_reads_the_count_callgrind_prints() -> None:
    stderr = "==1== Events    : Ir\n==1== Collected : 4512345678\n==1==\n==1== I   refs:  4,512"
    assert collected(stderr) == 4_512_345_678
    with pytest.raises(RuntimeError, match="no count"):
        collected("valgrind: command not found")


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the page bench seeds PostgreSQL with generate_series"
)
def test_every_page_it_counts_answers_from_a_kept_page_bench_database(
    django_db_blocker: Any,
) -> None:
    db_name = f"page_instructions_smoke_{os.getpid()}"
    env = {**os.environ, "LOG_LEVEL": "WARNING"}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, timeout=300, env=env
        )

    seeded = run(
        str(BENCH / "page_bench.py"),
        *("--scale", "0.001", "--iterations", "1", "--warmup", "0"),
        *("--db-name", db_name, "--keep"),
    )
    try:
        assert seeded.returncode == 0, seeded.stdout + seeded.stderr
        for label in PAGES:
            child = run(
                str(BENCH / "page_instructions.py"),
                *("--child", label, "--requests", "1", "--db-name", db_name),
            )
            assert child.returncode == 0, (label, child.stdout + child.stderr)
    finally:
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{db_name}"')
