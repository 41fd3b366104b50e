"""bench/http_bench.py --with-worker runs end to end at --tiny size: bin/serve's worker,
callbacks worker and beat beside gunicorn deliver every claim's refund to the stub payments
API, on queues of the run's own, so that it takes nothing from a suite's queue on the same
Redis (and leaves nothing there)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest
from django.db import connection

from approvals.models import Command, Tenant
from reconciliation.models import AdapterInvocation
from reconciliation.tasks import command_deliver
from tests.bench.test_http_bench_smoke import run_http_bench
from tests.reconciliation import worker_fixture

pytestmark = pytest.mark.slow  # gunicorn, two Celery workers, beat and pgbench

# Whoever else consumes this Redis: a command the bench's worker must not take.
OTHERS = "00000000-0000-4000-8000-000000000028"

broker = worker_fixture.broker


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the http bench needs PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_the_worker_beside_the_web_tier_delivers_every_claim_on_queues_of_its_own(
    transactional_db: Any, broker: worker_fixture.Broker
) -> None:
    command_deliver.apply_async(args=(OTHERS,))  # the suite's queue, "celery"
    assert broker.queued() == 1
    out = run_http_bench(
        *("--with-worker", "--no-replay", "--celery-concurrency", "1"),
        *("--callback-concurrency", "1"),
        broker_url=broker.url,
    )

    assert "CELERY_CONCURRENCY=1, callbacks worker CALLBACK_CONCURRENCY=1" in out, out
    queue = re.search(r"on queues of their own \((http-bench-[\w-]+)\)", out)
    assert queue, out
    assert re.search(r"\d+\.\d commands committed/s against \d+\.\d claims/s", out), out
    # Every claim's command was delivered once and committed by the bench's worker.
    (tenant,) = Tenant.objects.filter(slug__startswith="http-bench-")
    commands = Command.objects.filter(tenant=tenant, executed_by=Command.ExecutedBy.CONSOLE)
    assert commands.count() == 24 + 2 * 8, "the claim arm's requests, warm-up and tail"
    assert Counter(commands.values_list("state", flat=True)) == {"committed": 40}
    assert f"the claims' commands after the run: committed {commands.count()}" in out, out
    invocations = AdapterInvocation.objects.filter(command__in=commands)
    assert Counter(invocations.values_list("outcome", flat=True)) == {"committed": 40}
    # The other consumer's message is where it was, and the run's queues are gone.
    assert broker.queued() == 1
    assert list(broker.client.scan_iter(match=f"*{queue.group(1)}*")) == []
