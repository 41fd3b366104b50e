"""Issue 23: callback deliveries run on a queue of their own, consumed by a worker of their
own, so a callback receiver that dribbles its answer holds no worker a command needs; and
the call ends by its deadline. Real workers, a real dribbling receiver."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.db import connection

from approvals.models import CallbackAttempt, CallbackDelivery, Command
from tests.approvals.receivers import Receiver, dribble
from tests.conftest import Runtime, approve
from tests.demo import sandbox_fixture
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation import worker_fixture
from tests.reconciliation.conftest import claim_command
from tests.reconciliation.worker_fixture import Broker, Workers, wait_until

broker = worker_fixture.broker
workers = worker_fixture.workers
sandbox_server = sandbox_fixture.sandbox_server

DEADLINE = 15


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a real worker shares PostgreSQL")
def test_a_dribbling_callback_receiver_never_delays_a_command(
    runtime: Runtime,
    reviewer: Any,
    settings: Any,
    broker: Broker,
    workers: Workers,
    sandbox_server: SandboxProcess,
) -> None:
    settings.CALLBACK_ALLOW_HTTP = settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    receiver = Receiver(dribble(b"HTTP/1.1 200 OK\r\nX-Slow: ", every=0.5))
    try:
        put = runtime.client.put(
            "/api/v1/callback", json.dumps({"url": receiver.url}), content_type="application/json"
        )
        assert put.status_code == 200
        env = {
            "CALLBACK_ALLOW_HTTP": 1,
            "CALLBACK_ALLOW_PRIVATE_HOSTS": 1,
            "CALLBACK_MAX_ATTEMPTS": 1,
            "OUTBOUND_DEADLINE_SECONDS": DEADLINE,
        }
        # As bin/serve runs them: commands in one worker, callback deliveries in another.
        workers.start(sandbox_server, queues=(worker_fixture.QUEUE,), **env)
        workers.start(sandbox_server, queues=(worker_fixture.CALLBACKS_QUEUE,), **env)
        approve(runtime.propose(client_ref="first").json()["occurrence_id"], reviewer)
        started = time.monotonic()
        wait_until(
            "the callback's delivery to be taken",
            lambda: CallbackDelivery.objects.filter(leased_until__isnull=False).exists(),
            timeout=30,
        )

        command = claim_command(runtime, reviewer, ref="second")
        wait_until(
            "the refund to be executed",
            lambda: Command.objects.get(pk=command.pk).state == Command.State.COMMITTED,
            timeout=30,
        )

        # Executed while the receiver was still dribbling its answer to the callback.
        assert not CallbackAttempt.objects.exists()
        assert len(sandbox_server.refunds()) == 1
        wait_until("the callback's attempt", CallbackAttempt.objects.exists, timeout=DEADLINE + 30)
        took = time.monotonic() - started
        attempt = CallbackAttempt.objects.order_by("started_at").first()
        assert attempt is not None
        assert "ReadTimeout" in attempt.error and "deadline" in attempt.error
        assert took < DEADLINE + 15, took
    finally:
        receiver.close()
