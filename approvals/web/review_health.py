"""Review health (``/manage/review-health/``), for admins, over their tenants: how long
reviewers take to decide, per tool (p50, p95), and escalations and timeouts per day
(``approvals.reviews.health``; Prometheus reads the same from ``/metrics``)."""

from __future__ import annotations

from datetime import UTC, timedelta

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from approvals.reviews.health import deadline_days, decision_times
from approvals.web.shell import admin_scope, console_login_required

NOT_ADMIN = "Only admins of a tenant can see its review health."
# The windows the panel offers, in days; the first is the default.
WINDOWS = (7, 1, 30)


def seconds_text(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.0 h``: a time to decision at a glance."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


@require_GET
@console_login_required
def review_health(request: HttpRequest) -> HttpResponse:
    scope = admin_scope(request, NOT_ADMIN)
    chosen = scope.tenant(request.GET.get("tenant", ""))
    tenant_ids = [chosen.pk] if chosen else scope.tenant_ids
    days = next((d for d in WINDOWS if str(d) == request.GET.get("days")), WINDOWS[0])
    now = timezone.now()
    since = now - timedelta(days=days)
    times = decision_times(since=since, tenant_ids=tenant_ids)
    # Per day: the last ``days`` UTC calendar days, today's so far included.
    first_day = (now - timedelta(days=days - 1)).astimezone(UTC)
    midnight = first_day.replace(hour=0, minute=0, second=0, microsecond=0)
    per_day = deadline_days(since=midnight, until=now, tenant_ids=tenant_ids)
    context = scope.context(
        "review-health",
        tools=[(t, seconds_text(t.p50), seconds_text(t.p95)) for t in times],
        per_day=list(reversed(per_day)),
        escalated=sum(d.escalated for d in per_day),
        timed_out=sum(d.timed_out for d in per_day),
        days=days,
        windows=sorted(WINDOWS),
        chosen=chosen,
    )
    return render(request, "approvals/review_health.html", context)
