"""Reviewing: approve (a vote, and the approval once the quorum is reached), reject, and edit
(a new version that supersedes the old one and any approval of it)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, cast

from django.db import transaction

from approvals.access.tenancy import User, require_role, username_of
from approvals.audit.record import audit_record, db_now
from approvals.callbacks.outbox import callback_delivery_create
from approvals.canonical.form import canonicalize
from approvals.canonical.schema import validate_arguments
from approvals.errors import ErrorCode, InputError, ServiceError
from approvals.models import (
    Approval,
    ApprovalVote,
    Membership,
    NotificationEvent,
    Occurrence,
    Proposal,
)
from approvals.notifications.outbox import notification_event_create
from approvals.reviews.deadlines import deadlines_from, require_before_final_deadline
from approvals.vocabulary import (
    AuditKind,
    EventDecision,
    EventReason,
)


@dataclass(frozen=True)
class ApproveOutcome:
    issued: bool
    votes: int
    needed: int
    approval: Approval | None


def _lock_occurrence(occurrence: Occurrence) -> Occurrence:
    return (
        Occurrence.objects.select_for_update(of=("self",))
        .select_related("tool", "tenant")
        .get(pk=occurrence.pk)
    )


def lock_approvals_then_occurrence(occurrence: Occurrence) -> Occurrence:
    """Lock the occurrence's approvals, then the occurrence: the order a claim and a
    revocation take them. In the opposite order a change of the occurrence (an edit, a
    renewal) and a claim of its approval deadlock, and PostgreSQL aborts one of them."""
    list(
        Approval.objects.select_for_update()
        .filter(occurrence_id=occurrence.pk)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    return _lock_occurrence(occurrence)


def _require_pending(occurrence: Occurrence) -> None:
    require_before_final_deadline(occurrence, db_now())
    if occurrence.status != Occurrence.Status.PENDING_REVIEW:
        raise ServiceError(
            ErrorCode.NOT_PENDING,
            "This request is no longer pending review "
            f"(it is {occurrence.get_status_display().lower()}).",
        )


def occurrence_approve(
    *, occurrence: Occurrence, reviewer: User, seen_digest: str, via: str = "", batch: str = ""
) -> ApproveOutcome:
    """Record the reviewer's approval of the current version; issue the capability once
    the contract's quorum of distinct reviewers is reached. ``via`` names a personal access
    token the decision came through (``approvals.access.reviewer_tokens``), in the audit events;
    ``batch`` the bulk review it was part of (``approvals.reviews.bulk``), in them too.

    Refuses a digest that is not the current version's, a reviewer approving their own
    request or their own edit, a non-reviewer, and anything no longer pending. Concurrent
    approvers are serialized by the occurrence's row lock: exactly one of them issues the
    approval.
    """
    with transaction.atomic():
        occ = _lock_occurrence(occurrence)
        require_role(reviewer, occ.tenant_id, Membership.Role.REVIEWER)
        username = username_of(reviewer)
        # requested_by is agent-supplied: "Rita", "rita ", "rita\u200b" and rita's email
        # address all name rita (canonical.identity_key), so none of them lets her approve.
        from approvals.canonical.confusables import same_person

        if same_person(occ.requested_by, username, getattr(reviewer, "email", "") or ""):
            raise ServiceError(
                ErrorCode.SELF_APPROVAL,
                "You requested this action, so another reviewer must approve it.",
                403,
            )
        _require_pending(occ)
        proposal = occ.proposals.get(is_current=True)
        if proposal.edited_by_id is not None and proposal.edited_by_id == reviewer.pk:
            # Otherwise one reviewer could rewrite an action and approve it alone.
            raise ServiceError(
                ErrorCode.SELF_APPROVAL,
                "You edited this version, so another reviewer must approve it.",
                403,
            )
        if not hmac.compare_digest(seen_digest.encode(), proposal.action_digest.encode()):
            raise ServiceError(
                ErrorCode.STALE_DIGEST,
                "The action changed after you opened it. Review the new version before approving.",
            )
        _, created = ApprovalVote.objects.get_or_create(
            proposal=proposal, reviewer_id=reviewer.pk, defaults={"seen_digest": seen_digest}
        )
        needed = occ.tool.approvals_needed(proposal.arguments)
        votes = proposal.votes.count()
        if created:
            audit_record(
                kind=AuditKind.APPROVAL_VOTE_RECORDED,
                tenant=occ.tenant_id,
                occurrence=occ,
                actor=username,
                data={
                    "version": proposal.version,
                    "votes": votes,
                    "needed": needed,
                    **({"via": via} if via else {}),
                    **({"batch": batch} if batch else {}),
                },
            )
        if votes < needed:
            return ApproveOutcome(issued=False, votes=votes, needed=needed, approval=None)

        issued_at = db_now()
        approval = Approval.objects.create(
            tenant_id=occ.tenant_id,
            occurrence=occ,
            proposal=proposal,
            approver_id=cast(int, reviewer.pk),
            tool_name=occ.tool.name,
            action_digest=proposal.action_digest,
            proposal_version=proposal.version,
            issued_at=issued_at,
            expires_at=issued_at + occ.tool.approval_lifetime,
        )
        Occurrence.objects.filter(pk=occ.pk).update(
            status=Occurrence.Status.APPROVED, decided_at=issued_at, updated_at=issued_at
        )
        callback_delivery_create(
            audit_record(
                kind=AuditKind.APPROVAL_ISSUED,
                tenant=occ.tenant_id,
                occurrence=occ,
                actor=username,
                decision=EventDecision.ISSUED,
                data={
                    "version": proposal.version,
                    "action_digest": proposal.action_digest,
                    "expires_at": approval.expires_at.isoformat(),
                    "approvers": votes,
                    **({"via": via} if via else {}),
                    **({"batch": batch} if batch else {}),
                },
            )
        )
        notification_event_create(
            tenant_id=occ.tenant_id,
            occurrence_id=occ.pk,
            kind=NotificationEvent.Kind.DECIDED,
            outcome=Occurrence.Status.APPROVED,
            decided_by=username,
        )
    return ApproveOutcome(issued=True, votes=votes, needed=needed, approval=approval)


def occurrence_reject(
    *, occurrence: Occurrence, reviewer: User, reason: str, via: str = "", batch: str = ""
) -> Occurrence:
    """Reject a pending request. The reason reaches the agent when it asks for its token.
    ``via`` and ``batch`` as for ``occurrence_approve``."""
    reason = (reason or "").strip()
    if not reason:
        raise InputError("reason_required", "Say why you reject this request.", "reason")
    with transaction.atomic():
        occ = _lock_occurrence(occurrence)
        require_role(reviewer, occ.tenant_id, Membership.Role.REVIEWER)
        _require_pending(occ)
        now = db_now()
        Occurrence.objects.filter(pk=occ.pk).update(
            status=Occurrence.Status.REJECTED,
            rejection_reason=reason,
            decided_at=now,
            updated_at=now,
        )
        callback_delivery_create(
            audit_record(
                kind=AuditKind.OCCURRENCE_REJECTED,
                tenant=occ.tenant_id,
                occurrence=occ,
                actor=username_of(reviewer),
                decision=EventDecision.REJECTED,
                reason_code=EventReason.REJECTED_BY_REVIEWER,
                data={
                    "reason": reason,
                    **({"via": via} if via else {}),
                    **({"batch": batch} if batch else {}),
                },
            )
        )
        notification_event_create(
            tenant_id=occ.tenant_id,
            occurrence_id=occ.pk,
            kind=NotificationEvent.Kind.DECIDED,
            outcome=Occurrence.Status.REJECTED,
            decided_by=username_of(reviewer),
        )
    occ.refresh_from_db()
    return occ


def proposal_edit(
    *, occurrence: Occurrence, editor: User, arguments: Any, seen_digest: str
) -> Proposal:
    """Replace the current version's arguments with a new version n+1.

    The old version stays on record; an approval of it is marked superseded, so it can
    never authorize the new version (a claim with it gets ``scope_mismatch``).
    """
    with transaction.atomic():
        occ = lock_approvals_then_occurrence(occurrence)
        require_role(editor, occ.tenant_id, Membership.Role.REVIEWER)
        if occ.status not in {Occurrence.Status.PENDING_REVIEW, Occurrence.Status.APPROVED}:
            raise ServiceError(
                ErrorCode.NOT_EDITABLE, "Only a pending or unclaimed request can be edited."
            )
        require_before_final_deadline(occ, db_now())
        current = occ.proposals.get(is_current=True)
        if not hmac.compare_digest(seen_digest.encode(), current.action_digest.encode()):
            raise ServiceError(
                ErrorCode.STALE_DIGEST, "The action changed while you were editing it."
            )
        validate_arguments(occ.tool.json_schema, arguments)
        action = canonicalize(occ.tool.name, arguments)
        if action.digest == current.action_digest:
            raise InputError("no_change", "The edited action is identical to the current one.")
        now = db_now()
        Proposal.objects.filter(pk=current.pk).update(is_current=False)
        proposal = Proposal.objects.create(
            occurrence=occ,
            version=current.version + 1,
            canonical_action=action.canonical,
            action_digest=action.digest,
            edited_by_id=editor.pk,
        )
        superseded = Approval.objects.filter(
            proposal=current, state=Approval.State.ISSUED, superseded_at__isnull=True
        ).update(superseded_at=now)
        # An edit of an approved request withdraws the approval and puts it back in review:
        # the contract's deadlines run again from now. A pending one keeps its deadlines.
        again = deadlines_from(occ.tool, now) if occ.status == Occurrence.Status.APPROVED else {}
        Occurrence.objects.filter(pk=occ.pk).update(
            status=Occurrence.Status.PENDING_REVIEW,
            decided_at=None,
            updated_at=now,
            **({"escalated_at": None, **again} if again else {}),
        )
        callback_delivery_create(
            audit_record(
                kind=AuditKind.PROPOSAL_EDITED,
                tenant=occ.tenant_id,
                occurrence=occ,
                actor=username_of(editor),
                reason_code=EventReason.APPROVAL_SUPERSEDED if superseded else "",
                data={
                    "from_version": current.version,
                    "to_version": proposal.version,
                    "from_digest": current.action_digest,
                    "to_digest": proposal.action_digest,
                },
            )
        )
    return proposal


def rejection_details(occurrence: Occurrence) -> dict[str, Any]:
    """A rejection's facts as fields, for an error's ``details``."""
    decided_at = occurrence.decided_at
    return {
        "reason": occurrence.rejection_reason,
        "rejected_at": decided_at.isoformat() if decided_at else None,
    }
