"""Renewal: an occurrence whose approval expired unclaimed goes back to review as a new
version of the same action; nothing revives the expired approval."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from approvals.audit.record import audit_record, db_now
from approvals.callbacks.outbox import callback_delivery_create
from approvals.errors import ErrorCode, ServiceError
from approvals.models import (
    Approval,
    Occurrence,
    Proposal,
)
from approvals.reviews.deadlines import deadlines_from
from approvals.reviews.decisions import lock_approvals_then_occurrence, rejection_details
from approvals.vocabulary import (
    AuditKind,
    ClaimDecision,
    EventReason,
)


def _renew_refusal(occurrence: Occurrence, approval: Approval | None, now: datetime) -> None:
    """Raise the 409 that says why this occurrence cannot be renewed, if it cannot."""
    status = occurrence.status
    details: dict[str, Any] = {"status": status}
    if status == Occurrence.Status.REJECTED:
        raise ServiceError(
            ErrorCode.REJECTED,
            f"A reviewer rejected this request: {occurrence.rejection_reason}",
            details={**details, **rejection_details(occurrence)},
        )
    if status == Occurrence.Status.TIMED_OUT:
        raise ServiceError(
            ErrorCode.TIMED_OUT,
            "Nobody decided this request before its final deadline; propose it again.",
            details=details,
        )
    if status == Occurrence.Status.PENDING_REVIEW:
        raise ServiceError(
            ErrorCode.PENDING_REVIEW, "This request is already waiting for review.", details=details
        )
    if status == Occurrence.Status.AUTO_ADMITTED:
        raise ServiceError(
            ErrorCode.AUTO_ADMITTED,
            "This call was admitted by policy; it has no approval.",
            details=details,
        )
    if status == Occurrence.Status.CLAIMED or (
        approval is not None and approval.state == Approval.State.CONSUMED
    ):
        raise ServiceError(
            ErrorCode.CLAIMED, "This approval was claimed; it cannot be renewed.", details=details
        )
    if status == Occurrence.Status.REVOKED or (
        approval is not None and approval.state == Approval.State.REVOKED
    ):
        raise ServiceError(
            ErrorCode.REVOKED,
            "An admin revoked this approval; it cannot be renewed.",
            details=details,
        )
    expired = approval is not None and (
        approval.state == Approval.State.EXPIRED
        or (approval.state == Approval.State.ISSUED and approval.expires_at <= now)
    )
    if not expired:
        raise ServiceError(
            ErrorCode.NOT_EXPIRED,
            "This approval has not expired; pick up its token or claim it.",
            details={
                **details,
                "expires_at": approval.expires_at.isoformat() if approval else None,
            },
        )


def occurrence_renew(*, occurrence: Occurrence, actor: str) -> Proposal:
    """Send an occurrence whose approval expired unclaimed back to review.

    Nothing revives the expired approval: it stays on record, expired, bound to its version
    ``n``. The occurrence gets a new version ``n+1`` with the same canonical action (and
    digest), not edited by anyone, and becomes ``pending_review``. A new version is what
    makes the review fresh: votes and approvals belong to a version (one vote per reviewer
    and one approval per version), so the old version's votes do not count again, and the
    old approval (marked superseded) can never authorize the new one.

    Only an expired, unclaimed approval can be renewed: one past ``expires_at`` counts as
    expired even before the sweep writes it down (and is written down here). Anything else
    is refused with a 409 naming the state: ``pending_review``, ``not_expired``,
    ``claimed``, ``rejected``, ``revoked``, ``auto_admitted``.
    """
    with transaction.atomic():
        occ = lock_approvals_then_occurrence(occurrence)
        now = db_now()
        current = occ.proposals.get(is_current=True)
        approval = Approval.objects.filter(proposal=current).first()
        _renew_refusal(occ, approval, now)
        assert approval is not None  # _renew_refusal refuses an occurrence without one
        written_down = Approval.objects.filter(pk=approval.pk, state=Approval.State.ISSUED).update(
            state=Approval.State.EXPIRED
        )
        if written_down:
            # What the sweep would have written: the same event, before the renewal.
            callback_delivery_create(
                audit_record(
                    kind=AuditKind.APPROVAL_EXPIRED,
                    tenant=occ.tenant_id,
                    occurrence=occ,
                    actor="clock",
                    token_fingerprint=approval.fingerprint,
                    decision=ClaimDecision.EXPIRED,
                    reason_code=EventReason.EXPIRED_UNCLAIMED,
                    data={"expires_at": approval.expires_at.isoformat()},
                )
            )
        Approval.objects.filter(pk=approval.pk, superseded_at__isnull=True).update(
            superseded_at=now
        )
        Proposal.objects.filter(pk=current.pk).update(is_current=False)
        proposal = Proposal.objects.create(
            occurrence=occ,
            version=current.version + 1,
            canonical_action=current.canonical_action,
            action_digest=current.action_digest,
            edited_by=None,
        )
        Occurrence.objects.filter(pk=occ.pk).update(
            status=Occurrence.Status.PENDING_REVIEW,
            decided_at=None,
            updated_at=now,
            # Back in review: the contract's deadlines run again from now.
            escalated_at=None,
            **deadlines_from(occ.tool, now),
        )
        audit_record(
            kind=AuditKind.OCCURRENCE_RENEWED,
            tenant=occ.tenant_id,
            occurrence=occ,
            actor=actor,
            token_fingerprint=approval.fingerprint,
            reason_code=EventReason.APPROVAL_EXPIRED,
            data={
                "from_version": current.version,
                "to_version": proposal.version,
                "action_digest": proposal.action_digest,
                "expires_at": approval.expires_at.isoformat(),
            },
        )
    return proposal
