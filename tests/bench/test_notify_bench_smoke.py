"""bench/notify_bench.py runs end to end at --tiny size (a real Celery worker on the Redis
of REDIS_URL, e-mail to aiosmtpd, 20 requests), so that it cannot rot. It never asserts the
ratio: that is a measurement, not a property of the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from approvals.models import NotificationDelivery, NotificationEvent
from tests.bench.test_bench_smoke import _test_database_url

pytestmark = pytest.mark.slow  # the benchmark as a process, with its Celery worker

BENCH = Path(__file__).resolve().parents[2] / "bench" / "notify_bench.py"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the worker shares PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_notify_bench_runs_and_prints_the_ratio(transactional_db: Any) -> None:
    redis = os.environ.get("REDIS_URL", "")
    if not redis:
        pytest.fail("REDIS_URL is not set: run bin/test, which starts a Redis.", pytrace=False)
    # The subprocess writes to the test database; the transactional test's flush removes
    # its rows afterwards.
    env = {
        **os.environ,
        "DATABASE_URL": _test_database_url(),
        "CELERY_BROKER_URL": redis,
        "LOG_LEVEL": "WARNING",
    }
    result = subprocess.run(
        [sys.executable, str(BENCH), "--tiny", "--timeout", "240"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for arm in ("bare task, before", "drain: events fanned out", "drain: e-mails sent"):
        assert re.search(rf"^{arm}\s+20\s+\d+\.\d$", out, re.MULTILINE), out
    assert re.search(r"^ratio drain/bare: \d+\.\d{3}  \(target >= 0\.5: ", out, re.M), out
    assert re.search(r"^queries to create a request: \d+ routed and notified, \d+ ", out, re.M)
    # The worker really drained the outbox: every event fanned out, every e-mail sent (the
    # three requests of the query count were never published).
    fanned = NotificationEvent.objects.exclude(fanned_out_at=None).count()
    assert fanned == 20, out
    sent = NotificationDelivery.objects.filter(
        channel="email", state="delivered", event__isnull=False
    )
    assert sent.count() == 20, out
