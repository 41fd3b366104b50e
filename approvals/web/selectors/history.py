"""An occurrence's history, a window at a time, and the tally of its claims."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import (
    Case,
    Count,
    F,
    Min,
    QuerySet,
    Value,
    When,
)

from approvals import vocabulary
from approvals.models import (
    AuditEvent,
    Occurrence,
)
from approvals.sql import Columns, fetch, on_postgresql
from approvals.vocabulary import AuditKind, ClaimDecision

# A page shows the newest events; an occurrence whose token a runtime keeps replaying can
# have thousands. The audit API (/api/v1/audit/events) serves all of them.
HISTORY_PAGE = 50


@dataclass(frozen=True)
class HistoryCursor:
    """Which window of a history a page shows: the newest (neither set), the window just
    before event ``before``, or the one just after event ``after`` (``after=0``: the
    oldest). Event ids are keyset cursors: a window is one range scan of the (occurrence,
    id) index however far back it lies, never an OFFSET."""

    before: int | None = None
    after: int | None = None

    @classmethod
    def parse(cls, before: str | None, after: str | None) -> HistoryCursor:
        """From a page's query string; anything but a non-negative integer is ignored."""

        def event_id(value: str | None) -> int | None:
            if value is None or not value.isdigit() or len(value) > 19:
                return None
            return int(value)

        before_id, after_id = event_id(before), event_id(after)
        if before_id is not None:
            return cls(before=before_id)
        return cls(after=after_id)

    @property
    def query(self) -> dict[str, str]:
        """The cursor as query parameters (none for the newest window)."""
        if self.before is not None:
            return {"before": str(self.before)}
        if self.after is not None:
            return {"after": str(self.after)}
        return {}


# The newest window: what a page shows when no cursor is asked for.
NEWEST = HistoryCursor()


@dataclass(frozen=True)
class HistoryWindow:
    """Up to HISTORY_PAGE consecutive events of an occurrence, oldest first, and where
    they lie in its whole history."""

    events: list[AuditEvent]
    total: int  # events of the occurrence in all
    earlier: int  # events older than the first shown
    cursor: HistoryCursor = HistoryCursor()

    @property
    def later(self) -> int:
        """Events newer than the last shown."""
        return max(self.total - self.earlier - len(self.events), 0)

    @property
    def latest(self) -> bool:
        return self.later == 0


def occurrence_history(
    occurrence: Occurrence,
    cursor: HistoryCursor = NEWEST,
    *,
    total: int = 0,
    size: int = HISTORY_PAGE,
) -> HistoryWindow:
    """One window of the occurrence's audit events: one query for the newest window, and
    at most two for any other (the window, then how many events precede it, which the
    oldest windows know without asking). ``total`` is the number of events counted with
    the occurrence (``review_get``). Windows do not overlap: the one before the
    oldest full window holds what is left, however few."""
    if cursor.before is None and cursor.after is None:
        newest = _window(occurrence.pk, "newest", None, size)
        newest.reverse()
        total = max(total, len(newest))
        return HistoryWindow(newest, total, total - len(newest))
    if cursor.before is not None:
        window = _window(occurrence.pk, "before", cursor.before, size)
        window.reverse()
    else:
        window = _window(occurrence.pk, "after", cursor.after, size)
    if cursor.after == 0 or (cursor.before is not None and len(window) < size):
        earlier = 0  # the window starts at the first event
    elif window:
        earlier = _earlier(occurrence.pk, window[0].pk)
    else:
        earlier = total  # nothing after the cursor: every event is earlier
    return HistoryWindow(window, max(total, earlier + len(window)), earlier, cursor)


_EVENT = Columns(AuditEvent, "e")

# A window of the history: (the condition on the event id, the order), by cursor. The
# windows read the (occurrence, id) index, newest first or oldest first.
_WINDOWS = {
    "newest": ("", "DESC"),
    "before": ("AND e.id < %s", "DESC"),
    "after": ("AND e.id > %s", "ASC"),
}
_WINDOW_SQL = {
    name: f"""
SELECT {_EVENT.sql}
  FROM approvals_auditevent e
 WHERE e.occurrence_id = %s {condition}
 ORDER BY e.id {order}
 LIMIT %s"""  # noqa: S608 (no input in the text)
    for name, (condition, order) in _WINDOWS.items()
}


def _window(
    occurrence_id: uuid.UUID, name: str, event_id: int | None, size: int
) -> list[AuditEvent]:
    """A window's events in the order it reads them (the newest first for "newest" and
    "before")."""
    if on_postgresql():
        params = [occurrence_id, size] if event_id is None else [occurrence_id, event_id, size]
        return [_EVENT.load(row) for row in fetch(_WINDOW_SQL[name], params)]
    return list(_window_queryset(occurrence_id, name, event_id)[:size])


def _window_queryset(
    occurrence_id: uuid.UUID, name: str, event_id: int | None
) -> QuerySet[AuditEvent]:
    """The ORM twin of a window's statement (without its limit)."""
    events = AuditEvent.objects.filter(occurrence_id=occurrence_id)
    if name == "before":
        return events.filter(id__lt=event_id).order_by("-id")
    if name == "after":
        return events.filter(id__gt=event_id).order_by("id")
    return events.order_by("-id")


_EARLIER_SQL = """
SELECT COUNT(*) FROM approvals_auditevent e WHERE e.occurrence_id = %s AND e.id < %s"""


def _earlier(occurrence_id: uuid.UUID, event_id: int) -> int:
    """How many of the occurrence's events precede ``event_id``."""
    if on_postgresql():
        return int(fetch(_EARLIER_SQL, [occurrence_id, event_id])[0][0])
    return AuditEvent.objects.filter(occurrence_id=occurrence_id, id__lt=event_id).count()


_REJECTED_BY_SQL = """
SELECT e.actor FROM approvals_auditevent e
 WHERE e.occurrence_id = %s AND e.kind = %s
 ORDER BY e.id DESC
 LIMIT 1"""


def rejected_by(occurrence: Occurrence) -> str:
    """Who rejected the occurrence, from its last rejection event."""
    if on_postgresql():
        rows = fetch(_REJECTED_BY_SQL, [occurrence.pk, AuditKind.OCCURRENCE_REJECTED.value])
        actor = rows[0][0] if rows else ""
    else:
        actor = (
            AuditEvent.objects.filter(
                occurrence_id=occurrence.pk, kind=AuditKind.OCCURRENCE_REJECTED
            )
            .order_by("-id")
            .values_list("actor", flat=True)
            .first()
        )
    return actor or ""


# How many executions the evidence line names; it counts the others.
EVIDENCE_NAMES = 10


# Claims that handed out the command: the first one, and redeliveries to the same execution.
DELIVERED = vocabulary.ADMITTING


@dataclass(frozen=True)
class ClaimTally:
    """An occurrence's claim events, counted over all of them, however many there are."""

    # Claims by decision, in the order each decision first occurred.
    by_decision: dict[str, int]
    commands: int  # distinct commands of approved claims
    # Approved and redelivered claims per execution, first seen first.
    deliveries: list[tuple[str, int]]
    # Executions whose claims were refused as replays, first seen first (the first few),
    # and how many there are.
    replayers: list[str]
    replayer_total: int


def claim_tally(occurrence: Occurrence) -> ClaimTally:
    """The occurrence's claim events counted in one grouped query (and the first few
    replaying executions named in a second one, if there were replays).

    Approved and redelivered claims are grouped by execution too: there are at most as
    many of those executions as the occurrence has approvals. Refusals are not, since a
    runtime can present a token under any number of execution ids."""
    claims = AuditEvent.objects.filter(
        occurrence=occurrence, kind__startswith=vocabulary.CLAIM_PREFIX
    ).order_by()
    groups = (
        claims.values(
            "decision",
            delivered_to=Case(
                When(decision__in=DELIVERED, then=F("execution_id")), default=Value("")
            ),
        )
        .annotate(
            n=Count("id"),
            commands=Count("command_id", distinct=True),
            executions=Count("execution_id", distinct=True),
            first=Min("id"),
        )
        .order_by("first")
    )
    by_decision: dict[str, int] = {}
    deliveries: dict[str, int] = {}
    commands = replayer_total = 0
    for group in groups:
        decision = group["decision"]
        by_decision[decision] = by_decision.get(decision, 0) + group["n"]
        if decision in DELIVERED:
            execution = group["delivered_to"]
            deliveries[execution] = deliveries.get(execution, 0) + group["n"]
        if decision == ClaimDecision.APPROVED:
            commands += group["commands"]
        if decision == ClaimDecision.REPLAYED:
            replayer_total = group["executions"]
    replayers: list[str] = []
    if replayer_total:
        replayers = list(
            claims.filter(decision=ClaimDecision.REPLAYED)
            .values("execution_id")
            .annotate(first=Min("id"))
            .order_by("first")
            .values_list("execution_id", flat=True)[:EVIDENCE_NAMES]
        )
    return ClaimTally(
        by_decision=by_decision,
        commands=commands,
        deliveries=list(deliveries.items())[:EVIDENCE_NAMES],
        replayers=replayers,
        replayer_total=replayer_total,
    )


def claim_tally_of_events(events: Iterable[AuditEvent]) -> ClaimTally:
    """``claim_tally`` counted in Python, for a history whose every event the page has
    read already (it fits in one window): the same numbers, without asking again."""
    claims = sorted((e for e in events if e.kind.startswith(vocabulary.CLAIM_PREFIX)), key=_pk)
    by_decision: dict[str, int] = {}
    deliveries: dict[str, int] = {}
    commands: dict[str, set[uuid.UUID]] = {}
    replayers: dict[str, None] = {}
    for claim in claims:
        decision = claim.decision
        by_decision[decision] = by_decision.get(decision, 0) + 1
        if decision in DELIVERED:
            deliveries[claim.execution_id] = deliveries.get(claim.execution_id, 0) + 1
        if decision == ClaimDecision.APPROVED:
            # Distinct commands per approved execution, summed, as the grouped query does.
            executed = commands.setdefault(claim.execution_id, set())
            if claim.command_id is not None:
                executed.add(claim.command_id)
        elif decision == ClaimDecision.REPLAYED:
            replayers.setdefault(claim.execution_id)
    return ClaimTally(
        by_decision=by_decision,
        commands=sum(len(executed) for executed in commands.values()),
        deliveries=list(deliveries.items())[:EVIDENCE_NAMES],
        replayers=list(replayers)[:EVIDENCE_NAMES],
        replayer_total=len(replayers),
    )


def _pk(event: AuditEvent) -> int:
    return event.pk


# Counting a long history's claims groups every one of them (thousands for a token a
# runtime keeps replaying). Audit events are append-only (a trigger refuses UPDATE and
# DELETE), so the events an occurrence shows only ever grow: their number names them, and
# a tally counted at that number stays right until it changes. Long histories keep their
# tally per process under (occurrence, number of events, newest event); the first page
# after a new event counts again.
TALLY_CACHE_MIN_EVENTS = 500


TALLY_CACHE_SIZE = 256


_tallies: OrderedDict[tuple[uuid.UUID, int, int | None], ClaimTally] = OrderedDict()


_tallies_lock = threading.Lock()


def claim_tally_of_history(
    occurrence: Occurrence, *, events: int, last_event_id: int | None
) -> ClaimTally:
    """``claim_tally``, remembered for a long history while its ``events`` (the number
    of the occurrence's audit events) and ``last_event_id`` stay what they were."""
    if events < TALLY_CACHE_MIN_EVENTS:
        return claim_tally(occurrence)
    key = (occurrence.pk, events, last_event_id)
    with _tallies_lock:
        tally = _tallies.get(key)
        if tally is not None:
            _tallies.move_to_end(key)
            return tally
    tally = claim_tally(occurrence)
    with _tallies_lock:
        _tallies[key] = tally
        while len(_tallies) > TALLY_CACHE_SIZE:
            _tallies.popitem(last=False)
    return tally
