"""Past bulk revocations (``/manage/revocations/batches/``): who revoked, when, with which
filter, and how many approvals, read from their ``approval.revoked`` events (each carries
its batch's id and, since the list exists, its filter in words)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Max, Min
from django.db.models.fields.json import KT
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from approvals.models import AuditEvent
from approvals.vocabulary import AuditKind
from approvals.web.shell import admin_scope, console_login_required

TEMPLATE_BATCHES = "approvals/revocations_batches.html"
# The newest batches shown; older ones are in the audit trail (its export).
BATCHES_SHOWN = 50


@dataclass(frozen=True)
class PastBatch:
    batch: str
    actor: str
    at: datetime
    described: str  # "" for a batch revoked before filters were recorded
    count: int
    reason: str


def revocation_batches(tenant_ids: list[int], limit: int = BATCHES_SHOWN) -> list[PastBatch]:
    """The newest bulk revocations in these tenants, newest first: one query, grouped by
    the batch id the events carry."""
    rows = (
        AuditEvent.objects.filter(
            kind=AuditKind.APPROVAL_REVOKED, tenant_id__in=tenant_ids, data__has_key="batch"
        )
        .annotate(batch=KT("data__batch"))
        .values("batch")
        .annotate(
            at=Min("ingested_at"),
            actor=Max("actor"),
            described=Max(KT("data__filter")),
            reason=Max(KT("data__reason")),
            count=Count("id"),
        )
        .order_by("-at", "batch")[:limit]
    )
    return [
        PastBatch(
            batch=row["batch"],
            actor=row["actor"],
            at=row["at"],
            described=row["described"] or "",
            count=row["count"],
            reason=row["reason"] or "",
        )
        for row in rows
    ]


@require_GET
@console_login_required
def revocations_batches(request: HttpRequest) -> HttpResponse:
    scope = admin_scope(request)
    context = scope.context("revocations", batches=revocation_batches(scope.tenant_ids))
    return render(request, TEMPLATE_BATCHES, context)
