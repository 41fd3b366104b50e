"""bench/claim_bench.py runs end to end with a handful of claims, so that it cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection

from approvals.models import Approval, Command

pytestmark = pytest.mark.slow  # the benchmark as a process, forking its claimers

BENCH = Path(__file__).resolve().parents[2] / "bench" / "claim_bench.py"


def _test_database_url() -> str:
    db = settings.DATABASES["default"]
    auth = quote(db["USER"] or "", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the claim bench needs PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_claim_bench_runs_and_prints_the_ratio(transactional_db: Any) -> None:
    # The subprocess writes to the test database itself; the transactional test's flush
    # removes its rows afterwards.
    result = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--claims",
            "24",
            "--procs",
            "4",
            "--contenders",
            "2",
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DATABASE_URL": _test_database_url(), "LOG_LEVEL": "WARNING"},
    )

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"^ratio b/a: \d+\.\d\d$", out, re.MULTILINE), out
    rows = {line[0]: line.split() for line in out.splitlines() if line[:3] in {"a  ", "b  ", "c  "}}
    assert set(rows) == {"a", "b", "c"}, out
    # 12 approvals per arm, each claimed by two processes: one wins, one is refused.
    assert "replayed 12, won 12" in out
    assert rows["b"][rows["b"].index("service") + 2] == "0", out  # b's double claims
    consumed = Approval.objects.filter(state=Approval.State.CONSUMED).count()
    assert Command.objects.count() == consumed >= 36
