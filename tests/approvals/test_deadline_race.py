"""A reviewer's approval racing the timeout, in separate OS processes released by a
barrier: exactly one wins. The deadline falls among the racers' start times (jittered
around it), so some rounds the approval's transaction began before the deadline and some
after; either way the request ends approved or timed out, never both, never neither."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from approvals.errors import ServiceError
from approvals.models import Approval, AuditEvent, Occurrence, Tenant, ToolContract
from approvals.reviews.deadlines import occurrence_time_out
from approvals.reviews.decisions import occurrence_approve
from approvals.reviews.proposals import occurrence_propose
from tests.conftest import REFUND_ARGS, Runtime
from tests.races import RACE, Pool

pytestmark = [*RACE, pytest.mark.slow]

ROUNDS = 16
# How far each racer's start is spread around the deadline.
JITTER = 0.04


def approve_job(occurrence_id: str, reviewer_id: int, seen_digest: str, at: float) -> str:
    time.sleep(max(0.0, at - time.time()))
    try:
        occurrence_approve(
            occurrence=Occurrence.objects.get(pk=occurrence_id),
            reviewer=get_user_model().objects.get(pk=reviewer_id),
            seen_digest=seen_digest,
        )
    except ServiceError as exc:
        return exc.code
    return "issued"


def time_out_job(occurrence_id: str, at: float) -> str:
    """The sweep's step for one request, tried from ``at`` until it is decided."""
    time.sleep(max(0.0, at - time.time()))
    give_up = time.time() + 5
    while time.time() < give_up:
        if occurrence_time_out(occurrence_id):
            return "timed_out"
        status = Occurrence.objects.values_list("status", flat=True).get(pk=occurrence_id)
        if status != Occurrence.Status.PENDING_REVIEW:
            return "not_pending"
        time.sleep(0.002)
    return "never_due"


@pytest.fixture
def pool(transactional_db: Any) -> Iterator[Pool]:
    workers = Pool(2)
    try:
        yield workers
    finally:
        workers.close()


def db_clock() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
        return float(cursor.fetchone()[0])


def test_an_approval_racing_the_timeout_has_exactly_one_winner(
    pool: Pool, tenant: Tenant, reviewer: Any, runtime: Runtime
) -> None:
    ToolContract.objects.filter(name="issue_refund").update(final_deadline=timedelta(hours=1))
    outcomes: Counter[str] = Counter()
    for round_ in range(ROUNDS):
        occurrence, _ = occurrence_propose(
            runtime_key=runtime.key,
            tool="issue_refund",
            arguments={**REFUND_ARGS, "payment_id": f"pay_{round_}"},
            run_id="run-race",
            reason="race",
        )
        digest = occurrence.proposals.get(is_current=True).action_digest
        deadline = db_clock() + 0.3
        Occurrence.objects.filter(pk=occurrence.pk).update(final_deadline_at=timezone_at(deadline))
        results = pool.run(
            [
                (
                    approve_job,
                    {
                        "occurrence_id": str(occurrence.pk),
                        "reviewer_id": reviewer.pk,
                        "seen_digest": digest,
                        "at": deadline + random.uniform(-JITTER, JITTER),
                    },
                ),
                (time_out_job, {"occurrence_id": str(occurrence.pk), "at": deadline}),
            ]
        )

        status = Occurrence.objects.get(pk=occurrence.pk).status
        kinds = Counter(
            AuditEvent.objects.filter(occurrence=occurrence).values_list("kind", flat=True)
        )
        if results == ["issued", "not_pending"]:
            assert status == Occurrence.Status.APPROVED
            assert Approval.objects.filter(occurrence=occurrence).count() == 1
            assert kinds["approval.issued"] == 1 and kinds["occurrence.timed_out"] == 0
            outcomes["approved"] += 1
        else:
            assert results == ["timed_out", "timed_out"], results
            assert status == Occurrence.Status.TIMED_OUT
            assert not Approval.objects.filter(occurrence=occurrence).exists()
            assert kinds["occurrence.timed_out"] == 1 and kinds["approval.issued"] == 0
            outcomes["timed_out"] += 1
    # The jitter puts the approval on both sides of the deadline: both winners were seen.
    assert set(outcomes) == {"approved", "timed_out"}, outcomes


def timezone_at(epoch: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, tz=UTC)
