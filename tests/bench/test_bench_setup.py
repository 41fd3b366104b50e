"""Every benchmark that loads the console's settings starts from a shell with no
SECRET_KEY, as bench/README.md's commands are written (bench/django_setup.py gives it a
throwaway one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each benchmark loaded in a process of its own

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(
    "name",
    [
        "page_bench",
        "claim_bench",
        "audit_export_bench",
        "http_bench",
        "longpoll_bench",
        "notify_bench",
    ],
)
def test_a_bench_loads_without_a_secret_key(name: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    result = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
