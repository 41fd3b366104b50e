"""A bare ``pytest`` on SQLite must not go green by skipping the race, clock and worker
tests: it stops at once and says how to run the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_bare_run_on_sqlite_stops_and_says_how_to_run_the_suite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ALLOW_SQLITE_TESTS"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'bare.sqlite3'}"

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/test_bare_pytest.py",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 4, result.stdout + result.stderr
    # Said once, not once by the hook and again in pytest's summary.
    assert (result.stdout + result.stderr).count("run bin/test") == 1, result.stdout + result.stderr
