"""bench/longpoll_bench.py runs end to end at --tiny size (the asgi server, 20 waiters, both
read arms), so that it cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.bench.test_bench_smoke import _test_database_url

pytestmark = pytest.mark.slow  # the benchmark as a process, with the asgi server

BENCH = Path(__file__).resolve().parents[2] / "bench" / "longpoll_bench.py"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the long-poll needs PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_longpoll_bench_runs_and_prints_the_ratios(transactional_db: Any) -> None:
    redis = os.environ.get("REDIS_URL", "")
    if not redis:
        pytest.fail("REDIS_URL is not set: run bin/test, which starts a Redis.", pytrace=False)
    env = {**os.environ, "DATABASE_URL": _test_database_url(), "CELERY_BROKER_URL": redis}
    result = subprocess.run(
        [sys.executable, str(BENCH), "--tiny"], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"^alone\s+100\s", out, re.MULTILINE), out
    assert re.search(r"^crowd\s+100\s", out, re.MULTILINE), out
    assert re.search(r"^after\s+100\s", out, re.MULTILINE), out
    assert re.search(
        r"^ratio crowd/alone: rate \d+\.\d\d, p50 \d+\.\d\d, p95 \d+\.\d\d$", out, re.M
    )
    assert re.search(r"^wake after the decision's commit: .*\(0 over 1 s\)$", out, re.M), out
    reads = re.search(r"^server reads for the waiters: (\d+) ", out, re.M)
    assert reads and int(reads.group(1)) <= 2 * 20 + 4, out
