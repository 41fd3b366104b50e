"""celery beat sends the deadlines sweep and a real worker runs it: a request of a contract
with a few-second final deadline ends timed out, audited, with nobody acting; a request of
a contract without deadlines waits."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from approvals.models import AuditEvent, Occurrence, ToolContract
from tests.conftest import Runtime
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


def test_beat_and_a_worker_time_out_a_request_nobody_decided(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, workers: Workers
) -> None:
    ToolContract.objects.filter(name="issue_refund").update(
        review_deadline=timedelta(seconds=1), final_deadline=timedelta(seconds=3)
    )
    occurrence_id = runtime.propose(client_ref="beat-deadline").json()["occurrence_id"]
    waiting = runtime.propose(
        "send_message",
        {"to": "ana@example.com", "subject": "Hello", "body": "Your refund is on its way."},
        client_ref="beat-no-deadline",
    )
    assert waiting.status_code == 201, waiting.content

    worker = workers.start(remote)
    beat = workers.start_beat(remote, REVIEW_DEADLINES_SWEEP_SECONDS=0.5)
    wait_until(
        "the sweep to time the request out",
        lambda: Occurrence.objects.get(pk=occurrence_id).status == Occurrence.Status.TIMED_OUT,
        timeout=60,
    )

    kinds = list(
        AuditEvent.objects.filter(occurrence_id=occurrence_id)
        .order_by("id")
        .values_list("kind", "actor")
    )
    assert kinds == [
        ("occurrence.proposed", "runtime:agent"),
        ("occurrence.escalated", "console"),
        ("occurrence.timed_out", "console"),
    ]
    answer = runtime.get(f"/api/v1/occurrences/{occurrence_id}").json()
    assert answer["status"] == "timed_out"
    assert answer["escalated_at"] is not None
    other = Occurrence.objects.get(pk=waiting.json()["occurrence_id"])
    assert other.status == Occurrence.Status.PENDING_REVIEW
    assert "Sending due task review-deadlines" in beat.output()
    assert "approvals.tasks.review_deadlines_sweep" in worker.output()
    assert "unregistered task" not in worker.output().lower()
