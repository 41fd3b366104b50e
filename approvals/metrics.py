"""Prometheus metrics: what the console decided, and what is waiting.

Counters and histograms are incremented where things happen, each by one line (the API's
``propose`` and ``claim``, dispatch's ``_start``); the review decision is observed from
its audit event once the decision's transaction has committed. What is *waiting*
(pending reviews, effects by state) is read from the database when Prometheus scrapes,
one cheap query each, so it is right after a restart and the same on every instance.

Under gunicorn (several worker processes) and Celery (prefork) every process keeps its
own values; with ``PROMETHEUS_MULTIPROC_DIR`` set (``bin/serve`` and
``config/gunicorn.conf.py`` set it) they go to files in that directory, and a scrape of
any process on the host adds them up. The variable must be set before this module is
imported, and the directory emptied whenever the whole set of processes starts.

This app never imports ``reconciliation``; reconciliation reports dispatch latency here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, transaction
from django.db.models import Count
from django.db.models.signals import post_save
from django.utils import timezone
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from approvals.models import AuditEvent, Command, Occurrence
from approvals.reviews.health import deadline_days, decision_times
from approvals.vocabulary import (
    DECISION_WORDS,
    EFFECT_NOT_SENT,
    REVIEW_DECISION_KINDS,
    AuditKind,
    EventDecision,
)

if TYPE_CHECKING:
    from approvals.claims.claim import ClaimResult

# This process's own metrics. In multiprocess mode their values live in files instead,
# and a scrape reads the files (``exposition``).
REGISTRY = CollectorRegistry(auto_describe=True)

CLAIMS = Counter(
    "console_claims",
    "Claims presented through the API, by decision and reason.",
    ["decision", "reason"],
    registry=REGISTRY,
)
LONG_POLL_WAITING = Gauge(
    "console_long_poll_waiting",
    "Long-polls of GET /api/v1/occurrences/{id}?wait= waiting for a change now, after "
    "their first read (approvals.longpoll).",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
LONG_POLL_READS = Counter(
    "console_long_poll_reads",
    "Reads of an occurrence made on behalf of long-polls: the first, one per wake-up "
    "(or per fallback interval), and the last at the deadline.",
    registry=REGISTRY,
)
PROPOSALS = Counter(
    "console_proposals",
    "Proposals received through the API, by tool and the occurrence's status "
    "(pending_review, auto_admitted; repeated for a client_ref seen before).",
    ["tool", "status"],
    registry=REGISTRY,
)
REVIEW_DECISION_SECONDS = Histogram(
    "console_review_decision_seconds",
    "Time from a proposal to the reviewers' decision (approved: the approval issued).",
    ["decision"],
    buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400),
    registry=REGISTRY,
)
DISPATCH_LATENCY_SECONDS = Histogram(
    "console_dispatch_latency_seconds",
    "Time from the claim that created a command to the start of its first adapter call.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
    registry=REGISTRY,
)
REVIEW_DEADLINES = Counter(
    "console_review_deadlines",
    "Pending requests whose contract deadline passed, by what it did: escalated (the "
    "review deadline) or timed_out (the final deadline; the request ended fail-closed).",
    ["event"],
    registry=REGISTRY,
)

REPEATED = "repeated"


def proposal_received(occurrence: Occurrence, created: bool) -> None:
    PROPOSALS.labels(occurrence.tool.name, occurrence.status if created else REPEATED).inc()


def claim_decided(result: ClaimResult) -> None:
    CLAIMS.labels(result.decision, result.reason).inc()


def dispatch_started(command: Command, number: int, started_at: datetime) -> None:
    """An adapter call is about to start; the first one of a command is what a claim waited
    for (later ones wait for a retry's backoff or a redelivery, not for dispatch)."""
    if number == 1:
        seconds = (started_at - command.created_at).total_seconds()
        DISPATCH_LATENCY_SECONDS.observe(max(seconds, 0.0))


# --- the review decision, from its audit event -------------------------------------------

_DECISIONS: dict[str, str] = {kind: DECISION_WORDS[kind] for kind in REVIEW_DECISION_KINDS}
# A pending request's deadlines (``approvals.reviews.deadlines``), counted as they commit.
_DEADLINE_EVENTS: dict[str, str] = {
    AuditKind.OCCURRENCE_ESCALATED: EventDecision.ESCALATED,
    AuditKind.OCCURRENCE_TIMED_OUT: EventDecision.TIMED_OUT,
}
# Both series exist from the start (at 0), so a rate over them is defined before the first.
for _event in _DEADLINE_EVENTS.values():
    REVIEW_DEADLINES.labels(_event)


def _observe_decision(occurrence_id: Any, decision: str) -> None:
    times = (
        Occurrence.objects.filter(pk=occurrence_id, decided_at__isnull=False)
        .values_list("created_at", "decided_at")
        .first()
    )
    if times is not None:
        created_at, decided_at = times
        assert decided_at is not None  # filtered above
        seconds = (decided_at - created_at).total_seconds()
        REVIEW_DECISION_SECONDS.labels(decision).observe(max(seconds, 0.0))


def _audit_event_saved(
    sender: type[AuditEvent], instance: AuditEvent, created: bool, **kwargs: Any
) -> None:
    deadline = _DEADLINE_EVENTS.get(instance.kind)
    if deadline is not None and created and not kwargs.get("raw"):
        transaction.on_commit(functools.partial(REVIEW_DEADLINES.labels(deadline).inc), robust=True)
        return
    decision = _DECISIONS.get(instance.kind)
    if decision is None or not created or kwargs.get("raw") or instance.occurrence_id is None:
        return
    # Only a decision that committed counts; the read happens after the commit too.
    transaction.on_commit(
        functools.partial(_observe_decision, instance.occurrence_id, decision),
        robust=True,
    )


post_save.connect(
    _audit_event_saved, sender=AuditEvent, weak=False, dispatch_uid="approvals.metrics.decision"
)


# --- what is waiting, read at scrape time --------------------------------------------------


class WaitingCollector:
    """Pending reviews and effects by state: one query each, at scrape time."""

    def describe(self) -> Iterable[Metric]:
        # Registering a collector calls describe(); without it, it would call collect(),
        # which queries the database, at import time.
        return [
            GaugeMetricFamily("console_pending_reviews", ""),
            GaugeMetricFamily("console_effects", "", labels=["state"]),
            GaugeMetricFamily("console_metrics_database_up", ""),
        ]

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "console_metrics_database_up",
            "1 when this scrape could read the database gauges below, 0 when it could not.",
        )
        try:
            pending = Occurrence.objects.filter(status=Occurrence.Status.PENDING_REVIEW).count()
            by_state = dict(
                Command.objects.order_by()
                .values_list("state")
                .annotate(n=Count("pk"))
                .values_list("state", "n")
            )
        except DatabaseError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        reviews = GaugeMetricFamily(
            "console_pending_reviews", "Occurrences waiting for a reviewer's decision."
        )
        reviews.add_metric([], pending)
        yield reviews
        effects = GaugeMetricFamily(
            "console_effects",
            "Commands by effect state (not_sent is the outbox).",
            labels=["state"],
        )
        for state in Command.State.values:
            label = EFFECT_NOT_SENT if state == Command.State.PENDING else state
            effects.add_metric([label], by_state.get(state, 0))
        yield effects


_WAITING = WaitingCollector()
REGISTRY.register(_WAITING)


# --- review health, read at scrape time (approvals.reviews.health) -----------------------

# The window the review health gauges cover, up to the scrape.
HEALTH_WINDOW = timedelta(days=1)
QUANTILES = (("0.5", "p50"), ("0.95", "p95"))


class ReviewHealthCollector:
    """Time to decision per tool (p50, p95) and escalations and timeouts, over the last
    day, every tenant: two small reads on the ``audit_review_health`` index per scrape."""

    def describe(self) -> Iterable[Metric]:
        return [
            GaugeMetricFamily("console_review_time_to_decision_seconds", "", labels=["tool"]),
            GaugeMetricFamily("console_review_decisions_last_day", "", labels=["tool"]),
            GaugeMetricFamily("console_review_deadline_events_last_day", "", labels=["event"]),
        ]

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        since = now - HEALTH_WINDOW
        try:
            times = decision_times(since=since)
            days = deadline_days(since=since, until=now)
        except DatabaseError:
            return  # console_metrics_database_up says so
        quantiles = GaugeMetricFamily(
            "console_review_time_to_decision_seconds",
            "Time from a proposal to a reviewer's decision (approved or rejected), per tool, "
            "over the last day: the median (quantile 0.5) and the 95th percentile.",
            labels=["tool", "quantile"],
        )
        decided = GaugeMetricFamily(
            "console_review_decisions_last_day",
            "Reviewers' decisions over the last day, per tool.",
            labels=["tool"],
        )
        for tool in times:
            for quantile, field in QUANTILES:
                quantiles.add_metric([tool.tool, quantile], getattr(tool, field))
            decided.add_metric([tool.tool], tool.decided)
        yield quantiles
        yield decided
        deadlines = GaugeMetricFamily(
            "console_review_deadline_events_last_day",
            "Requests escalated (review deadline) and timed out (final deadline) over the "
            "last day.",
            labels=["event"],
        )
        deadlines.add_metric([EventDecision.ESCALATED], sum(d.escalated for d in days))
        deadlines.add_metric([EventDecision.TIMED_OUT], sum(d.timed_out for d in days))
        yield deadlines


_HEALTH = ReviewHealthCollector()
REGISTRY.register(_HEALTH)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def exposition() -> tuple[bytes, str]:
    """The text Prometheus scrapes, and its content type."""
    if multiprocess_dir() is None:
        return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(_WAITING)
    registry.register(_HEALTH)
    return generate_latest(registry), CONTENT_TYPE_LATEST
