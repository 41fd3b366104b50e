"""The review services: who may approve, reject, edit and revoke, and what each one records.

A refused review changes nothing, not even the audit trail (the ServiceError rolls its
transaction back); an accepted one writes exactly the events listed here.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from approvals.access import tokens
from approvals.access.runtime_keys import runtime_key_create
from approvals.claims.claim import approval_claim
from approvals.claims.delivery import approval_deliver_token
from approvals.errors import InputError, ServiceError
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Epoch,
    Membership,
    Occurrence,
    Tenant,
)
from approvals.reviews.decisions import occurrence_approve, occurrence_reject, proposal_edit
from approvals.reviews.revocation import approval_revoke, approvals_revoke
from tests.conftest import REFUND_ARGS, Runtime, make_user

BIG_REFUND = {**REFUND_ARGS, "amount_minor": 50001}


def _propose(
    runtime: Runtime, arguments: dict[str, Any] | None = None, **fields: Any
) -> Occurrence:
    response = runtime.propose(arguments=arguments, **fields)
    assert response.status_code == 201, response.content
    return Occurrence.objects.get(pk=response.json()["occurrence_id"])


def _digest(occurrence: Occurrence) -> str:
    return occurrence.proposals.get(is_current=True).action_digest


def _approve(occurrence: Occurrence, reviewer: Any, seen_digest: str | None = None) -> Any:
    return occurrence_approve(
        occurrence=occurrence,
        reviewer=reviewer,
        seen_digest=_digest(occurrence) if seen_digest is None else seen_digest,
    )


def _events(occurrence: Occurrence) -> list[tuple[str, str, str, str]]:
    """The review's audit trail, without the proposal event every occurrence starts with."""
    return list(
        AuditEvent.objects.filter(occurrence=occurrence)
        .exclude(kind="occurrence.proposed")
        .values_list("kind", "actor", "decision", "reason_code")
    )


def _refused(code: str, status: int, call: Any, occurrence: Occurrence) -> None:
    """The call raises ServiceError(code, status) and leaves no vote, approval or event."""
    before = _events(occurrence)
    status_before = Occurrence.objects.get(pk=occurrence.pk).status
    votes_before = ApprovalVote.objects.filter(proposal__occurrence=occurrence).count()
    with pytest.raises(ServiceError) as raised:
        call()
    assert (raised.value.code, raised.value.status) == (code, status)
    assert _events(occurrence) == before
    assert Occurrence.objects.get(pk=occurrence.pk).status == status_before
    assert ApprovalVote.objects.filter(proposal__occurrence=occurrence).count() == votes_before


# --- approve ------------------------------------------------------------------------------


def test_approve_issues_the_capability_and_records_vote_and_issue(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence = _propose(runtime)

    outcome = _approve(occurrence, reviewer)

    assert (outcome.issued, outcome.votes, outcome.needed) == (True, 1, 1)
    approval = Approval.objects.get(occurrence=occurrence)
    assert approval == outcome.approval
    assert approval.state == Approval.State.ISSUED
    assert approval.approver_id == reviewer.pk
    assert approval.action_digest == _digest(occurrence)
    assert approval.tool_name == "issue_refund"
    assert approval.proposal_version == 1
    assert approval.expires_at - approval.issued_at == timedelta(minutes=15)
    assert approval.token_hash is None
    assert Occurrence.objects.get(pk=occurrence.pk).status == Occurrence.Status.APPROVED
    assert _events(occurrence) == [
        ("approval.vote_recorded", "rita", "", ""),
        ("approval.issued", "rita", "issued", ""),
    ]
    issued = AuditEvent.objects.get(occurrence=occurrence, kind="approval.issued")
    assert issued.data == {
        "version": 1,
        "action_digest": approval.action_digest,
        "expires_at": approval.expires_at.isoformat(),
        "approvers": 1,
    }


def test_approve_refuses_a_stale_digest(runtime: Runtime, reviewer: Any) -> None:
    occurrence = _propose(runtime)
    stale = "0" * 64

    _refused("stale_digest", 409, lambda: _approve(occurrence, reviewer, stale), occurrence)

    assert not Approval.objects.exists()


def test_approve_refuses_the_digest_of_an_edited_away_version(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence = _propose(runtime)
    old_digest = _digest(occurrence)
    proposal_edit(
        occurrence=occurrence,
        editor=second_reviewer,
        arguments={**REFUND_ARGS, "amount_minor": 100},
        seen_digest=old_digest,
    )

    _refused("stale_digest", 409, lambda: _approve(occurrence, reviewer, old_digest), occurrence)


@pytest.mark.parametrize("role", [None, Membership.Role.OPERATOR, Membership.Role.ADMIN])
def test_approve_refuses_a_non_reviewer(runtime: Runtime, tenant: Tenant, role: str | None) -> None:
    occurrence = _propose(runtime)
    user = make_user("nora", tenant, *([role] if role else []))

    _refused("forbidden", 403, lambda: _approve(occurrence, user), occurrence)


def test_approve_refuses_a_reviewer_of_another_tenant(
    runtime: Runtime, other_tenant: Tenant
) -> None:
    occurrence = _propose(runtime)
    outsider = make_user("olga", other_tenant, Membership.Role.REVIEWER)

    _refused("forbidden", 403, lambda: _approve(occurrence, outsider), occurrence)


def test_approve_refuses_the_requester(runtime: Runtime, reviewer: Any) -> None:
    occurrence = _propose(runtime, requested_by=reviewer.get_username())

    _refused("self_approval", 403, lambda: _approve(occurrence, reviewer), occurrence)


def test_approve_refuses_what_is_no_longer_pending(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    approved = _propose(runtime)
    _approve(approved, reviewer)
    rejected = _propose(runtime, client_ref="second")
    occurrence_reject(occurrence=rejected, reviewer=reviewer, reason="No")

    _refused("not_pending", 409, lambda: _approve(approved, second_reviewer), approved)
    _refused("not_pending", 409, lambda: _approve(approved, reviewer), approved)
    _refused("not_pending", 409, lambda: _approve(rejected, second_reviewer), rejected)
    assert Approval.objects.filter(occurrence=approved).count() == 1
    assert not Approval.objects.filter(occurrence=rejected).exists()


# --- quorum -------------------------------------------------------------------------------


def test_big_refund_needs_two_distinct_reviewers(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence = _propose(runtime, BIG_REFUND)

    first = _approve(occurrence, reviewer)
    again = _approve(occurrence, reviewer)

    assert (first.issued, first.votes, first.needed, first.approval) == (False, 1, 2, None)
    assert (again.issued, again.votes, again.needed, again.approval) == (False, 1, 2, None)
    assert not Approval.objects.exists()
    assert Occurrence.objects.get(pk=occurrence.pk).status == Occurrence.Status.PENDING_REVIEW
    # The repeated vote is not a new fact, so it is not recorded twice.
    assert _events(occurrence) == [("approval.vote_recorded", "rita", "", "")]

    second = _approve(occurrence, second_reviewer)

    assert (second.issued, second.votes, second.needed) == (True, 2, 2)
    approval = Approval.objects.get(occurrence=occurrence)
    assert approval.approver_id == second_reviewer.pk
    assert _events(occurrence) == [
        ("approval.vote_recorded", "rita", "", ""),
        ("approval.vote_recorded", "ravi", "", ""),
        ("approval.issued", "ravi", "issued", ""),
    ]
    assert AuditEvent.objects.get(kind="approval.issued").data["approvers"] == 2


def test_refund_at_the_threshold_needs_one_reviewer(runtime: Runtime, reviewer: Any) -> None:
    occurrence = _propose(runtime, {**REFUND_ARGS, "amount_minor": 50000})

    outcome = _approve(occurrence, reviewer)

    assert (outcome.issued, outcome.votes, outcome.needed) == (True, 1, 1)


def test_votes_on_an_edited_away_version_do_not_count(
    runtime: Runtime, tenant: Tenant, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence = _propose(runtime, BIG_REFUND)
    _approve(occurrence, reviewer)
    proposal_edit(
        occurrence=occurrence,
        editor=make_user("rosa", tenant, Membership.Role.REVIEWER),
        arguments={**BIG_REFUND, "amount_minor": 60000},
        seen_digest=_digest(occurrence),
    )

    outcome = _approve(occurrence, second_reviewer)

    assert (outcome.issued, outcome.votes, outcome.needed) == (False, 1, 2)
    assert not Approval.objects.exists()


# --- reject -------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["", "   "])
def test_reject_requires_a_reason(runtime: Runtime, reviewer: Any, reason: str) -> None:
    occurrence = _propose(runtime)

    with pytest.raises(InputError) as raised:
        occurrence_reject(occurrence=occurrence, reviewer=reviewer, reason=reason)

    assert (raised.value.code, raised.value.field) == ("reason_required", "reason")
    assert Occurrence.objects.get(pk=occurrence.pk).status == Occurrence.Status.PENDING_REVIEW
    assert _events(occurrence) == []


def test_reject_records_the_reason(runtime: Runtime, reviewer: Any) -> None:
    occurrence = _propose(runtime)

    rejected = occurrence_reject(
        occurrence=occurrence, reviewer=reviewer, reason="  Wrong payment.  "
    )

    assert rejected.status == Occurrence.Status.REJECTED
    assert rejected.rejection_reason == "Wrong payment."
    assert rejected.decided_at is not None
    assert _events(occurrence) == [
        ("occurrence.rejected", "rita", "rejected", "rejected_by_reviewer")
    ]
    assert AuditEvent.objects.get(kind="occurrence.rejected").data == {"reason": "Wrong payment."}


def test_reject_refuses_a_non_reviewer_and_what_is_not_pending(
    runtime: Runtime, reviewer: Any, operator: Any
) -> None:
    occurrence = _propose(runtime)

    _refused(
        "forbidden",
        403,
        lambda: occurrence_reject(occurrence=occurrence, reviewer=operator, reason="x"),
        occurrence,
    )
    _approve(occurrence, reviewer)
    _refused(
        "not_pending",
        409,
        lambda: occurrence_reject(occurrence=occurrence, reviewer=reviewer, reason="x"),
        occurrence,
    )


# --- edit ---------------------------------------------------------------------------------


def test_edit_supersedes_the_approval_of_the_old_version(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence = _propose(runtime)
    _approve(occurrence, reviewer)
    old_digest = _digest(occurrence)

    proposal = proposal_edit(
        occurrence=occurrence,
        editor=second_reviewer,
        arguments={**REFUND_ARGS, "amount_minor": 100},
        seen_digest=old_digest,
    )

    assert proposal.version == 2
    assert proposal.is_current
    old = Approval.objects.get(occurrence=occurrence)
    assert old.superseded_at is not None
    assert old.state == Approval.State.ISSUED
    assert Occurrence.objects.get(pk=occurrence.pk).status == Occurrence.Status.PENDING_REVIEW
    assert _events(occurrence)[-1] == ("proposal.edited", "ravi", "", "approval_superseded")


def test_edit_refuses_stale_digest_non_reviewer_and_no_change(
    runtime: Runtime, reviewer: Any, operator: Any
) -> None:
    occurrence = _propose(runtime)
    digest = _digest(occurrence)
    edited = {**REFUND_ARGS, "amount_minor": 100}

    def edit(editor: Any, arguments: Any, seen: str) -> Any:
        return lambda: proposal_edit(
            occurrence=occurrence, editor=editor, arguments=arguments, seen_digest=seen
        )

    _refused("stale_digest", 409, edit(reviewer, edited, "0" * 64), occurrence)
    _refused("forbidden", 403, edit(operator, edited, digest), occurrence)
    with pytest.raises(InputError) as raised:
        edit(reviewer, dict(REFUND_ARGS), digest)()
    assert raised.value.code == "no_change"
    with pytest.raises(InputError) as raised:
        edit(reviewer, {**REFUND_ARGS, "amount_minor": 1.5}, digest)()
    assert raised.value.code == "float_not_allowed"
    assert occurrence.proposals.count() == 1


def test_claimed_occurrence_cannot_be_edited(
    runtime: Runtime, approved: str, token: str, reviewer: Any
) -> None:
    assert runtime.claim(token, "exec-a").status_code == 200
    occurrence = Occurrence.objects.get(pk=approved)

    _refused(
        "not_editable",
        409,
        lambda: proposal_edit(
            occurrence=occurrence,
            editor=reviewer,
            arguments={**REFUND_ARGS, "amount_minor": 100},
            seen_digest=_digest(occurrence),
        ),
        occurrence,
    )


# --- revoke -------------------------------------------------------------------------------


def test_revoke_requires_an_admin(
    runtime: Runtime, approved: str, reviewer: Any, operator: Any
) -> None:
    approval = Approval.objects.get(occurrence_id=approved)
    occurrence = approval.occurrence

    for user in (reviewer, operator):
        _refused(
            "forbidden",
            403,
            lambda user=user: approval_revoke(approval=approval, admin=user, reason="x"),
            occurrence,
        )
    assert Approval.objects.get(pk=approval.pk).state == Approval.State.ISSUED


def test_revoke_requires_a_reason(approved: str, admin_user: Any) -> None:
    approval = Approval.objects.get(occurrence_id=approved)

    with pytest.raises(InputError) as raised:
        approval_revoke(approval=approval, admin=admin_user, reason=" ")

    assert raised.value.code == "reason_required"
    assert Approval.objects.get(pk=approval.pk).state == Approval.State.ISSUED


def test_admin_revokes_once_and_it_is_recorded(
    runtime: Runtime, approved: str, token: str, admin_user: Any
) -> None:
    approval = Approval.objects.get(occurrence_id=approved)

    assert approval_revoke(approval=approval, admin=admin_user, reason="Fraud")
    assert not approval_revoke(approval=approval, admin=admin_user, reason="Again")

    approval.refresh_from_db()
    assert approval.state == Approval.State.REVOKED
    assert approval.revoked_at is not None
    assert (approval.revoked_by, approval.revoke_reason) == ("ada", "Fraud")
    assert approval.occurrence.status == Occurrence.Status.REVOKED
    (event,) = AuditEvent.objects.filter(kind="approval.revoked")
    assert (event.actor, event.decision, event.reason_code) == (
        "ada",
        "revoked",
        "revoked_by_admin",
    )
    assert event.token_fingerprint == tokens.fingerprint(token)
    assert event.data == {"reason": "Fraud"}


def test_consumed_approval_cannot_be_revoked(
    runtime: Runtime, approved: str, token: str, admin_user: Any
) -> None:
    assert runtime.claim(token, "exec-a").status_code == 200
    approval = Approval.objects.get(occurrence_id=approved)

    assert not approval_revoke(approval=approval, admin=admin_user, reason="Too late")

    approval.refresh_from_db()
    assert approval.state == Approval.State.CONSUMED
    assert not AuditEvent.objects.filter(kind="approval.revoked").exists()


def test_bulk_revoke_revokes_only_issued_approvals(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    occurrences = [_propose(runtime, client_ref=f"ref-{i}") for i in range(3)]
    for occurrence in occurrences:
        _approve(occurrence, reviewer)
    token = approval_deliver_token(occurrence=occurrences[0]).token
    claimed = approval_claim(
        tenant=tenant, token=token, tool="issue_refund", arguments=REFUND_ARGS, execution_id="e"
    )
    assert claimed.decision == "approved"

    revoked = approvals_revoke(
        approvals=Approval.objects.filter(tenant=tenant), actor="kill-switch", reason="Incident"
    )

    assert revoked == 2
    states = dict(Approval.objects.values_list("occurrence_id", "state"))
    assert states == {
        occurrences[0].pk: Approval.State.CONSUMED,
        occurrences[1].pk: Approval.State.REVOKED,
        occurrences[2].pk: Approval.State.REVOKED,
    }
    assert AuditEvent.objects.filter(kind="approval.revoked", actor="kill-switch").count() == 2


# --- admission by policy, runtime keys ------------------------------------------------------


def test_read_only_call_is_admitted_with_the_justification_an_epoch_would_name(
    runtime: Runtime,
) -> None:
    occurrence = _propose(runtime, tool="lookup_order", arguments={"order_id": "ord_1"})

    assert occurrence.status == Occurrence.Status.AUTO_ADMITTED
    assert occurrence.admission_justification == Epoch.Justification.READ_ONLY
    assert _events(occurrence) == [
        ("occurrence.auto_admitted", "policy", "auto_admitted", "policy_read_only")
    ]


def test_runtime_key_keeps_only_its_prefix_and_four_characters_in_clear(tenant: Tenant) -> None:
    key, raw = runtime_key_create(tenant=tenant, name="ci")

    assert key.prefix == raw[:7]
    assert key.prefix.startswith(tokens.RUNTIME_KEY_PREFIX)
    assert key.key_hash == tokens.hash_secret(raw)


# --- separation of duties over edits, and what the kill switch may touch --------------------


def test_the_editor_of_a_version_cannot_approve_it_alone(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence = _propose(runtime)
    proposal_edit(
        occurrence=occurrence,
        editor=second_reviewer,
        arguments={**REFUND_ARGS, "payment_id": "pay_attacker"},
        seen_digest=_digest(occurrence),
    )

    _refused("self_approval", 403, lambda: _approve(occurrence, second_reviewer), occurrence)

    assert _approve(occurrence, reviewer).issued


def test_revoking_by_approver_spares_the_live_approval_of_a_newer_version(
    runtime: Runtime, tenant: Tenant, reviewer: Any, second_reviewer: Any
) -> None:
    third = make_user("rosa", tenant, Membership.Role.REVIEWER)
    occurrence = _propose(runtime)
    _approve(occurrence, reviewer)
    proposal_edit(
        occurrence=occurrence,
        editor=third,
        arguments={**REFUND_ARGS, "amount_minor": 100},
        seen_digest=_digest(occurrence),
    )
    assert _approve(occurrence, second_reviewer).issued

    # The old approval can authorize nothing any more: there is nothing to revoke.
    revoked = approvals_revoke(
        approvals=Approval.objects.filter(approver=reviewer), actor="cli", reason="incident"
    )

    assert revoked == 0
    occurrence.refresh_from_db()
    assert occurrence.status == Occurrence.Status.APPROVED
    live = Approval.objects.get(occurrence=occurrence, superseded_at__isnull=True)
    assert live.state == Approval.State.ISSUED


def test_kill_switch_does_not_count_approvals_that_already_expired(
    approved: str, admin_user: Any
) -> None:
    approval = Approval.objects.get(occurrence_id=approved)
    Approval.objects.filter(pk=approval.pk).update(
        issued_at=approval.issued_at - timedelta(hours=1),
        expires_at=approval.issued_at - timedelta(minutes=1),
    )

    revoked = approvals_revoke(approvals=Approval.objects.all(), actor="cli", reason="incident")

    assert revoked == 0
    assert Approval.objects.get(pk=approval.pk).state == Approval.State.ISSUED
    assert Occurrence.objects.get(pk=approved).status == Occurrence.Status.APPROVED
