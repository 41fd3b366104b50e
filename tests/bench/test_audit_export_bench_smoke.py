"""bench/audit_export_bench.py runs end to end at a tiny size, so that it cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

pytestmark = pytest.mark.slow  # the benchmark as a process

BENCH = Path(__file__).resolve().parents[2] / "bench" / "audit_export_bench.py"


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the audit export bench measures PostgreSQL's COPY"
)
def test_audit_export_bench_prints_both_rates_and_the_ratio() -> None:
    # Same server and credentials as the test database (DATABASE_URL); the bench creates
    # and drops a database of its own, named apart from any other run's.
    result = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--events",
            "2000",
            "--python-path",
            "--db-name",
            f"audit_export_bench_smoke_{os.getpid()}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LOG_LEVEL": "WARNING"},
    )

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "2,000 audit events of one tenant (seeded in" in out
    assert re.search(r"^chained in \d+\.\d s", out, re.MULTILINE), out
    for label in [
        "COPY (SELECT row_to_json(e)) TO",
        "GET /api/v1/audit/events",
        "the same lines written by Python",
    ]:
        row = next((line for line in out.splitlines() if line.startswith(label)), None)
        assert row is not None, f"no row for {label!r} in:\n{out}"
        events, size, seconds, rate, mb_per_s, memory = row[len(label) :].split()
        assert events == "2,000"
        assert float(size) > 0
        assert float(seconds) > 0
        assert float(rate.replace(",", "")) > 0
        assert float(mb_per_s) > 0
        assert float(memory) >= -1000
    assert re.search(r"^ratio export/COPY: \d+\.\d\d$", out, re.MULTILINE), out
    assert re.search(r"^peak RSS growth of the export: -?\d+\.\d MB$", out, re.MULTILINE), out
