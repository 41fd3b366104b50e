"""A bulk approval racing a single rejection of one of its requests, in separate OS
processes released by a barrier: exactly one wins, and the batch is never half written
(every request approved, or none of them and the one rejected)."""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from approvals.errors import ServiceError
from approvals.models import Approval, ApprovalVote, AuditEvent, Occurrence, Tenant
from approvals.reviews.bulk import BulkItem, occurrences_approve
from approvals.reviews.decisions import occurrence_reject
from approvals.reviews.proposals import occurrence_propose
from tests.conftest import REFUND_ARGS, Runtime
from tests.races import RACE, Pool

pytestmark = [*RACE, pytest.mark.slow]

ROUNDS = 12
BATCH = 8


def bulk_approve_job(
    tenant_id: int, reviewer_id: int, items: list[tuple[str, int, str]], jitter_ms: float
) -> str:
    time.sleep(random.uniform(0, jitter_ms) / 1000)
    try:
        occurrences_approve(
            reviewer=get_user_model().objects.get(pk=reviewer_id),
            items=[BulkItem(uuid.UUID(pk), v, d) for pk, v, d in items],
            tenant_ids=[tenant_id],
        )
    except ServiceError as exc:
        return exc.code
    return "approved"


def reject_job(occurrence_id: str, reviewer_id: int, jitter_ms: float) -> str:
    time.sleep(random.uniform(0, jitter_ms) / 1000)
    try:
        occurrence_reject(
            occurrence=Occurrence.objects.get(pk=occurrence_id),
            reviewer=get_user_model().objects.get(pk=reviewer_id),
            reason="Not this one",
        )
    except ServiceError as exc:
        return exc.code
    return "rejected"


@pytest.fixture
def pool(transactional_db: Any) -> Iterator[Pool]:
    workers = Pool(2)
    try:
        yield workers
    finally:
        workers.close()


def test_bulk_approval_racing_a_single_rejection_has_exactly_one_winner(
    pool: Pool, tenant: Tenant, reviewer: Any, second_reviewer: Any, runtime: Runtime
) -> None:
    outcomes: Counter[str] = Counter()
    for round_ in range(ROUNDS):
        occurrences = [
            occurrence_propose(
                runtime_key=runtime.key,
                tool="issue_refund",
                arguments={**REFUND_ARGS, "payment_id": f"pay_{round_}_{i}"},
                run_id=f"run-race-{round_}",
                reason="race",
            )[0]
            for i in range(BATCH)
        ]
        items = []
        for occurrence in occurrences:
            proposal = occurrence.proposals.get(is_current=True)
            items.append((str(occurrence.pk), proposal.version, proposal.action_digest))
        target = random.choice(occurrences)
        # Alternate who gets the head start, so both orders are seen.
        bulk_jitter, reject_jitter = (0, 20) if round_ % 2 else (20, 0)
        results = pool.run(
            [
                (
                    bulk_approve_job,
                    {
                        "tenant_id": tenant.pk,
                        "reviewer_id": reviewer.pk,
                        "items": items,
                        "jitter_ms": bulk_jitter,
                    },
                ),
                (
                    reject_job,
                    {
                        "occurrence_id": str(target.pk),
                        "reviewer_id": second_reviewer.pk,
                        "jitter_ms": reject_jitter,
                    },
                ),
            ]
        )

        ids = [o.pk for o in occurrences]
        statuses = Counter(Occurrence.objects.filter(pk__in=ids).values_list("status", flat=True))
        approvals = Approval.objects.filter(occurrence_id__in=ids).count()
        votes = ApprovalVote.objects.filter(proposal__occurrence_id__in=ids).count()
        issued = AuditEvent.objects.filter(occurrence_id__in=ids, kind="approval.issued").count()
        if results == ["approved", "not_pending"]:
            assert statuses == {Occurrence.Status.APPROVED: BATCH}
            assert approvals == votes == issued == BATCH
            outcomes["bulk"] += 1
        else:
            assert results == ["not_pending", "rejected"], results
            assert statuses == {
                Occurrence.Status.PENDING_REVIEW: BATCH - 1,
                Occurrence.Status.REJECTED: 1,
            }
            assert Occurrence.objects.get(pk=target.pk).status == Occurrence.Status.REJECTED
            assert approvals == votes == issued == 0
            outcomes["single"] += 1
    assert set(outcomes) == {"bulk", "single"}, outcomes
