"""Bulk review's service: all of the batch or none of it, each request by its own rules."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from approvals.errors import ErrorCode, InputError, ServiceError
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Membership,
    Occurrence,
    Tenant,
)
from approvals.reviews.bulk import (
    BULK_MAX,
    BulkItem,
    occurrences_approve,
    occurrences_reject,
)
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from approvals.reviews.proposals import occurrence_propose
from tests.conftest import REFUND_ARGS, Runtime, make_user

pytestmark = pytest.mark.django_db


def propose(runtime: Runtime, n: int, **arguments: Any) -> Occurrence:
    occurrence, _ = occurrence_propose(
        runtime_key=runtime.key,
        tool="issue_refund",
        arguments={**REFUND_ARGS, "payment_id": f"pay_{n}", **arguments},
        run_id="run-bulk",
        reason="bulk",
        requested_by="agent",
    )
    return occurrence


def shown(occurrence: Occurrence) -> BulkItem:
    proposal = occurrence.proposals.get(is_current=True)
    return BulkItem(occurrence.pk, proposal.version, proposal.action_digest)


def batch(runtime: Runtime, n: int, **arguments: Any) -> list[Occurrence]:
    return [propose(runtime, i, **arguments) for i in range(n)]


def test_a_batch_approves_each_request_bound_to_its_own_digest(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    occurrences = batch(runtime, 5)
    items = [shown(o) for o in occurrences]

    result = occurrences_approve(reviewer=reviewer, items=items, tenant_ids=[tenant.pk])

    assert result.issued == 5
    for item in items:
        approval = Approval.objects.get(occurrence_id=item.occurrence_id)
        assert approval.action_digest == item.digest
        assert approval.proposal.action_digest == item.digest
        assert Occurrence.objects.get(pk=item.occurrence_id).status == Occurrence.Status.APPROVED
    issued = AuditEvent.objects.filter(kind="approval.issued")
    assert issued.count() == 5
    assert {e.data["batch"] for e in issued} == {str(result.batch_id)}
    assert {e.occurrence_id for e in issued} == {i.occurrence_id for i in items}


def test_one_changed_request_refuses_the_batch_and_writes_nothing(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, tenant: Tenant
) -> None:
    occurrences = batch(runtime, 4)
    items = [shown(o) for o in occurrences]
    changed = occurrences[2]
    proposal_edit(
        occurrence=changed,
        editor=second_reviewer,
        arguments={**REFUND_ARGS, "payment_id": "pay_2", "amount_minor": 7000},
        seen_digest=items[2].digest,
    )
    events_before = AuditEvent.objects.count()

    with pytest.raises(ServiceError) as refused:
        occurrences_approve(reviewer=reviewer, items=items, tenant_ids=[tenant.pk])

    assert refused.value.code == ErrorCode.STALE_DIGEST
    assert refused.value.details is not None
    assert refused.value.details["occurrence_id"] == str(changed.pk)
    assert str(changed.pk)[:8] in refused.value.message
    assert not Approval.objects.exists()
    assert not ApprovalVote.objects.exists()
    assert AuditEvent.objects.count() == events_before
    assert set(Occurrence.objects.values_list("status", flat=True)) == {
        Occurrence.Status.PENDING_REVIEW
    }


def test_a_request_decided_since_the_page_refuses_the_batch(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, tenant: Tenant
) -> None:
    occurrences = batch(runtime, 3)
    items = [shown(o) for o in occurrences]
    occurrence_reject(occurrence=occurrences[1], reviewer=second_reviewer, reason="no")

    with pytest.raises(ServiceError) as refused:
        occurrences_approve(reviewer=reviewer, items=items, tenant_ids=[tenant.pk])

    assert refused.value.code == ErrorCode.NOT_PENDING
    assert refused.value.details and refused.value.details["occurrence_id"] == str(
        occurrences[1].pk
    )
    assert not Approval.objects.exists()


def test_the_same_digest_under_a_newer_version_is_a_change(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, tenant: Tenant
) -> None:
    """Edited away and back: the digest is the one shown, the version is not."""
    [occurrence] = batch(runtime, 1)
    first = shown(occurrence)
    args = {**REFUND_ARGS, "payment_id": "pay_0"}
    v2 = proposal_edit(
        occurrence=occurrence,
        editor=second_reviewer,
        arguments={**args, "amount_minor": 1},
        seen_digest=first.digest,
    )
    proposal_edit(
        occurrence=occurrence, editor=second_reviewer, arguments=args, seen_digest=v2.action_digest
    )
    assert shown(occurrence).digest == first.digest

    with pytest.raises(ServiceError) as refused:
        occurrences_approve(reviewer=reviewer, items=[first], tenant_ids=[tenant.pk])
    assert refused.value.code == ErrorCode.STALE_DIGEST


def test_self_approval_of_one_member_refuses_the_whole_batch(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    occurrences = batch(runtime, 3)
    Occurrence.objects.filter(pk=occurrences[1].pk).update(requested_by="rita")
    items = [shown(o) for o in occurrences]

    with pytest.raises(ServiceError) as refused:
        occurrences_approve(reviewer=reviewer, items=items, tenant_ids=[tenant.pk])

    assert refused.value.code == ErrorCode.SELF_APPROVAL
    assert refused.value.details and refused.value.details["occurrence_id"] == str(
        occurrences[1].pk
    )
    assert not Approval.objects.exists()
    assert not ApprovalVote.objects.exists()


def test_the_quorum_applies_per_request(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, tenant: Tenant
) -> None:
    small = propose(runtime, 1)
    large = propose(runtime, 2, amount_minor=90000)  # above EUR 500.00: two reviewers

    first = occurrences_approve(
        reviewer=reviewer, items=[shown(small), shown(large)], tenant_ids=[tenant.pk]
    )

    outcome = {d.occurrence_id: d for d in first.decided}
    assert outcome[small.pk].issued
    assert not outcome[large.pk].issued
    assert (outcome[large.pk].votes, outcome[large.pk].needed) == (1, 2)
    assert Occurrence.objects.get(pk=large.pk).status == Occurrence.Status.PENDING_REVIEW
    vote = AuditEvent.objects.get(kind="approval.vote_recorded", occurrence=large)
    assert vote.data["batch"] == str(first.batch_id)

    second = occurrences_approve(
        reviewer=second_reviewer, items=[shown(large)], tenant_ids=[tenant.pk]
    )
    assert second.issued == 1


def test_a_reviewer_of_another_tenant_cannot_reach_its_requests(
    runtime: Runtime, other_runtime: Runtime, reviewer: Any, tenant: Tenant, other_tenant: Tenant
) -> None:
    mine = propose(runtime, 1)
    theirs = propose(other_runtime, 2)

    with pytest.raises(ServiceError) as refused:
        occurrences_approve(
            reviewer=reviewer, items=[shown(mine), shown(theirs)], tenant_ids=[tenant.pk]
        )

    assert refused.value.code == ErrorCode.NOT_FOUND
    assert refused.value.status == 404
    assert refused.value.details and refused.value.details["occurrence_id"] == str(theirs.pk)
    assert not Approval.objects.exists()


def test_a_tenant_listed_without_the_reviewer_role_is_refused(
    runtime: Runtime, tenant: Tenant
) -> None:
    operator = make_user("otto", tenant, Membership.Role.OPERATOR)
    occurrence = propose(runtime, 1)

    with pytest.raises(ServiceError) as refused:
        occurrences_approve(reviewer=operator, items=[shown(occurrence)], tenant_ids=[tenant.pk])

    assert refused.value.code == ErrorCode.FORBIDDEN
    assert not Approval.objects.exists()


def test_more_than_the_bound_is_refused_before_anything_is_read(
    runtime: Runtime, reviewer: Any, tenant: Tenant, django_assert_num_queries: Any
) -> None:
    items = [BulkItem(uuid.uuid4(), 1, "0" * 64) for _ in range(BULK_MAX + 1)]
    with django_assert_num_queries(0), pytest.raises(InputError) as refused:
        occurrences_approve(reviewer=reviewer, items=items, tenant_ids=[tenant.pk])
    assert refused.value.code == "batch_too_large"
    assert str(BULK_MAX) in refused.value.message


def test_a_batch_of_several_tools_is_refused(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    refund = propose(runtime, 1)
    message, _ = occurrence_propose(
        runtime_key=runtime.key,
        tool="send_message",
        arguments={"to": "ana@example.com", "subject": "Hi", "body": "Parcel."},
        run_id="run-bulk",
        reason="bulk",
    )
    with pytest.raises(InputError) as refused:
        occurrences_approve(
            reviewer=reviewer, items=[shown(refund), shown(message)], tenant_ids=[tenant.pk]
        )
    assert refused.value.code == "batch_mixed_tools"
    assert not Approval.objects.exists()


def test_a_bulk_rejection_rejects_each_with_the_one_reason(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    occurrences = batch(runtime, 3)
    result = occurrences_reject(
        reviewer=reviewer,
        items=[shown(o) for o in occurrences],
        tenant_ids=[tenant.pk],
        reason="Duplicates of one refund",
    )
    rejected = Occurrence.objects.filter(status=Occurrence.Status.REJECTED)
    assert rejected.count() == 3
    assert set(rejected.values_list("rejection_reason", flat=True)) == {"Duplicates of one refund"}
    events = AuditEvent.objects.filter(kind="occurrence.rejected")
    assert {e.data["batch"] for e in events} == {str(result.batch_id)}
    assert events.count() == 3


def test_a_bulk_rejection_needs_a_reason(runtime: Runtime, reviewer: Any, tenant: Tenant) -> None:
    occurrences = batch(runtime, 2)
    with pytest.raises(InputError) as refused:
        occurrences_reject(
            reviewer=reviewer,
            items=[shown(o) for o in occurrences],
            tenant_ids=[tenant.pk],
            reason="  ",
        )
    assert refused.value.code == "reason_required"
    assert not Occurrence.objects.filter(status=Occurrence.Status.REJECTED).exists()
