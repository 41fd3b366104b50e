"""Issue 25, operators: a whole worker dies mid-call (master and pool, as when its machine
goes), so nothing requeues its message until the broker's visibility timeout (here an hour).
With the console's default dispatch settings, the outbox sweep sees that no call can still
be in flight (``DISPATCH_STUCK_SENDING_SECONDS``: the outbound deadline and a margin) and
delivers the command again: the effect is settled within 60 s of the death, and says so.

Real Redis, real ``celery worker`` and ``celery beat`` processes, the real sandbox."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from approvals.models import Command
from approvals.vocabulary import QueueReason
from reconciliation.models import AdapterInvocation
from reconciliation.selectors.queue import queue_counts
from tests.conftest import Runtime
from tests.demo.sandbox_fixture import start_sandbox
from tests.reconciliation import worker_fixture
from tests.reconciliation.conftest import claim_command
from tests.reconciliation.worker_fixture import Broker, Workers, wait_until

broker = worker_fixture.broker
workers = worker_fixture.workers

SETTLE_WITHIN_SECONDS = 60.0


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="real workers share PostgreSQL with the test"
)
def test_a_whole_workers_death_mid_call_is_settled_within_a_minute(
    runtime: Runtime, reviewer: Any, broker: Broker, workers: Workers, tmp_path: Path
) -> None:
    # The sandbox makes the refund, then holds its answer far longer than this test: the
    # worker is in its call when it dies.
    hold = 300.0
    with start_sandbox(tmp_path / "sandbox", hold_seconds=hold) as sandbox:
        sandbox.fault("timeout_after_effect")
        # Read timeout past the hold: only the outbound deadline could end this call.
        first = workers.start(sandbox, ADAPTER_READ_TIMEOUT=hold)
        command = claim_command(runtime, reviewer, execution_id="exec-dies")
        wait_until(
            "the worker's call to create the refund and hang",
            lambda: len(sandbox.refunds()) == 1 and broker.unacked() == 1,
        )

        os.killpg(first.pid, signal.SIGKILL)  # the machine goes: master and pool at once
        died = time.monotonic()
        first.stop()
        # Default dispatch settings from here on: only the fixture's broker and sandbox.
        workers.start(sandbox)
        workers.start_beat(sandbox)
        wait_until(
            "the outbox sweep to settle the command",
            lambda: Command.objects.get(pk=command.pk).state == Command.State.COMMITTED,
            timeout=2 * SETTLE_WITHIN_SECONDS,
        )
        settled_after = time.monotonic() - died
        print(f"\nworker death to a settled effect: {settled_after:.1f} s (default settings)")
        assert settled_after <= SETTLE_WITHIN_SECONDS
        assert broker.unacked() == 1, "the dead worker's message was not what settled it"

    kinds = list(
        AdapterInvocation.objects.filter(command=command)
        .order_by("number")
        .values_list("kind", "outcome")
    )
    assert kinds == [("execute", "abandoned"), ("query", "committed")]


@pytest.mark.django_db
def test_the_queue_calls_a_command_stuck_sending_once_no_call_can_be_in_flight(
    runtime: Runtime, reviewer: Any
) -> None:
    assert settings.DISPATCH_STUCK_SENDING_SECONDS < settings.OPERATIONS_STUCK_SECONDS
    command = claim_command(runtime, reviewer)
    now = timezone.now()
    in_flight = now - timedelta(seconds=settings.DISPATCH_STUCK_SENDING_SECONDS - 5)
    Command.objects.filter(pk=command.pk).update(state=Command.State.SENDING, updated_at=in_flight)
    tenants = [runtime.key.tenant_id]
    assert queue_counts(tenant_ids=tenants, now=now)[QueueReason.STUCK_SENDING] == 0

    gone = now - timedelta(seconds=settings.DISPATCH_STUCK_SENDING_SECONDS + 1)
    Command.objects.filter(pk=command.pk).update(updated_at=gone)

    assert queue_counts(tenant_ids=tenants, now=now)[QueueReason.STUCK_SENDING] == 1
