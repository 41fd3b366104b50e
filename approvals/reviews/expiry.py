"""Expiry: the sweep that writes down what the clock already decided (a claim never depended
on it: the guard compares ``expires_at`` with the database's clock)."""

from __future__ import annotations

from django.db import transaction

from approvals.audit.record import DbNow, audit_record
from approvals.callbacks.outbox import callback_delivery_create
from approvals.models import (
    Approval,
    Occurrence,
)
from approvals.vocabulary import (
    AuditKind,
    ClaimDecision,
    EventReason,
)

# One sweep expires at most this many approvals; the next run takes the rest.
EXPIRE_BATCH = 500


def approvals_expire() -> int:
    """Write down what the clock already decided: every issued approval past its expiry
    becomes ``expired`` (audited as ``approval.expired``), and its occurrence, if still
    approved, becomes ``expired`` too, so that the inbox's filters agree with its badges.

    A claim never depended on this (the guard compares ``expires_at`` with the database's
    clock); rows another transaction holds are skipped and taken by the next sweep."""
    with transaction.atomic():
        targets = list(
            Approval.objects.filter(state=Approval.State.ISSUED, expires_at__lte=DbNow())
            .select_for_update(of=("self",), skip_locked=True)
            .order_by("pk")
            .values("pk", "tenant_id", "occurrence_id", "fingerprint", "expires_at")[:EXPIRE_BATCH]
        )
        if not targets:
            return 0
        expired = Approval.objects.filter(
            pk__in=[t["pk"] for t in targets], state=Approval.State.ISSUED
        ).update(state=Approval.State.EXPIRED)
        Occurrence.objects.filter(
            pk__in=[t["occurrence_id"] for t in targets], status=Occurrence.Status.APPROVED
        ).update(status=Occurrence.Status.EXPIRED, updated_at=DbNow())
        for target in targets:
            callback_delivery_create(
                audit_record(
                    kind=AuditKind.APPROVAL_EXPIRED,
                    tenant=target["tenant_id"],
                    occurrence=target["occurrence_id"],
                    actor="clock",
                    token_fingerprint=target["fingerprint"],
                    decision=ClaimDecision.EXPIRED,
                    reason_code=EventReason.EXPIRED_UNCLAIMED,
                    data={"expires_at": target["expires_at"].isoformat()},
                )
            )
    return expired
