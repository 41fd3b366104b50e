"""Reads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from approvals.models import Approval, AuditEvent, Command, Epoch, Occurrence, Proposal, Tenant


def parse_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def approval_state(approval: Approval, now: datetime | None = None) -> str:
    """The state a person or runtime should see: an issued approval past its expiry is
    expired even before anything writes that down."""
    now = now or timezone.now()
    if approval.state == Approval.State.ISSUED and approval.expires_at <= now:
        return Approval.State.EXPIRED
    return approval.state


def occurrence_detail_queryset() -> QuerySet[Occurrence]:
    return Occurrence.objects.select_related("tool", "tenant").prefetch_related(
        Prefetch("proposals", queryset=Proposal.objects.order_by("version")),
        Prefetch("approvals", queryset=Approval.objects.select_related("approver", "proposal")),
        Prefetch("commands", queryset=Command.objects.order_by("created_at")),
        Prefetch("epochs", queryset=Epoch.objects.order_by("number")),
    )


def occurrence_get_for_tenant(*, tenant: Tenant, occurrence_id: str) -> Occurrence | None:
    pk = parse_uuid(occurrence_id)
    if pk is None:
        return None
    return occurrence_detail_queryset().filter(tenant=tenant, pk=pk).first()


def current_proposal(occurrence: Occurrence) -> Proposal:
    """The current version, from the prefetched proposals."""
    return next(p for p in occurrence.proposals.all() if p.is_current)


def current_approval(occurrence: Occurrence) -> Approval | None:
    """The approval of the current version, from the prefetched approvals."""
    proposal = current_proposal(occurrence)
    return next((a for a in occurrence.approvals.all() if a.proposal_id == proposal.pk), None)


def audit_events_after(*, tenant: Tenant, after: int = 0) -> Iterator[AuditEvent]:
    return (
        AuditEvent.objects.filter(tenant=tenant, id__gt=after)
        .order_by("id")
        .iterator(chunk_size=500)
    )
