"""Review health: how long reviewers take to decide, per tool (p50, p95), and how many
requests were escalated and timed out, per day. Read from the audit trail: a reviewer's
decision is its ``approval.issued`` or ``occurrence.rejected`` event (not a policy's
rejection of a repeat, not an event another producer sent in), measured from the
request's proposal; an escalation or a timeout is its own event
(``approvals.reviews.deadlines``). The partial index ``audit_review_health`` holds only
these four kinds, by time, so the reads stay small however long the trail grows.

The admin panel (``/manage/review-health/``) reads it for the admin's tenants;
``approvals.metrics`` for every tenant, when Prometheus scrapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncDate

from approvals.models import AuditEvent, ToolContract
from approvals.sql import fetch, on_postgresql, words
from approvals.vocabulary import REVIEW_DECISION_KINDS, AuditKind

# Who decided by policy rather than as a reviewer (a repeat of a rejected action).
POLICY_ACTOR = "policy"
DEADLINE_KINDS = (AuditKind.OCCURRENCE_ESCALATED, AuditKind.OCCURRENCE_TIMED_OUT)
# Every kind the index holds (the migration names them as they are now).
HEALTH_KINDS = (*REVIEW_DECISION_KINDS, *DEADLINE_KINDS)


@dataclass(frozen=True)
class ToolTimes:
    """Time to decision of one tool's requests decided in the window."""

    tool: str
    decided: int
    p50: float  # seconds
    p95: float


@dataclass(frozen=True)
class DayCounts:
    day: date  # UTC
    escalated: int
    timed_out: int


def percentile(values: Sequence[float], fraction: float) -> float:
    """PostgreSQL's ``percentile_cont``: linear between the two nearest ranks."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _tenant_sql(tenant_ids: list[int] | None) -> tuple[str, list[object]]:
    return ("", []) if tenant_ids is None else (" AND e.tenant_id = ANY(%s)", [tenant_ids])


_TIMES_SQL = """
SELECT t.name, COUNT(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY d.seconds),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY d.seconds)
  FROM (SELECT o.tool_id,
               GREATEST(EXTRACT(EPOCH FROM e.source_time - o.created_at), 0) AS seconds
          FROM approvals_auditevent e
          JOIN approvals_occurrence o ON o.id = e.occurrence_id
         WHERE e.kind IN ({kinds}) AND e.ingestion_id IS NULL AND e.actor <> %s
           AND e.source_time >= %s{tenants}) d
  JOIN approvals_toolcontract t ON t.id = d.tool_id
 GROUP BY t.name
 ORDER BY t.name"""


def _events(
    kinds: Sequence[str], since: datetime, tenant_ids: list[int] | None
) -> QuerySet[AuditEvent]:
    events = AuditEvent.objects.filter(
        kind__in=list(kinds), ingestion__isnull=True, source_time__gte=since
    )
    return events if tenant_ids is None else events.filter(tenant_id__in=tenant_ids)


def decision_times(*, since: datetime, tenant_ids: list[int] | None = None) -> list[ToolTimes]:
    """Per tool, in name order: reviewers' decisions since ``since`` (of ``tenant_ids``, or
    every tenant), and the median and 95th percentile of their time from the proposal."""
    if on_postgresql():
        where, params = _tenant_sql(tenant_ids)
        sql = _TIMES_SQL.format(kinds=words(REVIEW_DECISION_KINDS), tenants=where)
        rows = fetch(sql, [POLICY_ACTOR, since, *params])
        return [ToolTimes(name, int(n), float(p50), float(p95)) for name, n, p50, p95 in rows]
    decided = (
        _events(REVIEW_DECISION_KINDS, since, tenant_ids)
        .filter(occurrence__isnull=False)
        .exclude(actor=POLICY_ACTOR)
        .values_list("occurrence__tool_id", "source_time", "occurrence__created_at")
    )
    seconds: dict[int, list[float]] = {}
    for tool_id, decided_at, created_at in decided:
        seconds.setdefault(tool_id, []).append(max((decided_at - created_at).total_seconds(), 0))
    names = dict(ToolContract.objects.filter(pk__in=seconds).values_list("pk", "name"))
    return sorted(
        (
            ToolTimes(names[tool], len(v), percentile(v, 0.5), percentile(v, 0.95))
            for tool, v in seconds.items()
        ),
        key=lambda times: times.tool,
    )


def deadline_days(
    *, since: datetime, until: datetime, tenant_ids: list[int] | None = None
) -> list[DayCounts]:
    """Escalations and timeouts per UTC day from ``since``'s day to ``until``'s, every day
    listed (0 on a quiet one), oldest first."""
    counted = (
        _events(DEADLINE_KINDS, since, tenant_ids)
        .annotate(day=TruncDate("source_time", tzinfo=UTC))
        .order_by()
        .values("day", "kind")
        .annotate(n=Count("id"))
        .values_list("day", "kind", "n")
    )
    by_day = {(day, kind): n for day, kind, n in counted}
    first, last = since.astimezone(UTC).date(), until.astimezone(UTC).date()
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    return [
        DayCounts(
            day,
            by_day.get((day, AuditKind.OCCURRENCE_ESCALATED), 0),
            by_day.get((day, AuditKind.OCCURRENCE_TIMED_OUT), 0),
        )
        for day in days
    ]
