"""celery beat sends the expiry sweep and a real worker runs it: an approval past its
expiry is marked expired within a few seconds, audited, with nobody calling the service."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals.models import Approval, AuditEvent, Occurrence
from tests.conftest import Runtime, approve
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation import worker_fixture
from tests.reconciliation.worker_fixture import Workers, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="real workers share PostgreSQL with the test"
    ),
]

broker = worker_fixture.broker
workers = worker_fixture.workers


def test_beat_and_a_worker_expire_what_the_clock_expired(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, workers: Workers
) -> None:
    occurrence_id = runtime.propose(client_ref="beat-expiry").json()["occurrence_id"]
    approve(occurrence_id, reviewer)
    in_time = runtime.propose(client_ref="beat-in-time").json()["occurrence_id"]
    approve(in_time, reviewer)
    past = timezone.now() - timedelta(seconds=1)
    Approval.objects.filter(occurrence_id=occurrence_id).update(
        issued_at=past - timedelta(minutes=15), expires_at=past
    )

    worker = workers.start(remote)
    beat = workers.start_beat(remote, APPROVAL_EXPIRY_SWEEP_SECONDS=0.5)
    wait_until(
        "the sweep to mark the approval expired",
        lambda: Approval.objects.get(occurrence_id=occurrence_id).state == Approval.State.EXPIRED,
    )

    assert Occurrence.objects.get(pk=occurrence_id).status == Occurrence.Status.EXPIRED
    event = AuditEvent.objects.get(occurrence_id=occurrence_id, kind="approval.expired")
    assert (event.actor, event.decision) == ("clock", "expired")
    assert Approval.objects.get(occurrence_id=in_time).state == Approval.State.ISSUED
    assert "Sending due task expire-what-the-clock-expired" in beat.output()
    assert "approvals.tasks.approvals_expire" in worker.output()
    assert "unregistered task" not in worker.output().lower()
