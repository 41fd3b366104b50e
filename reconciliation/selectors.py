"""Reads of effect, recovery and epoch evidence."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, DateTimeField, Prefetch, QuerySet

from approvals.compiled import (
    Compiled,
    CompiledStatement,
    Param,
    ParamArray,
    ParamList,
    literals,
    prefetched,
)
from approvals.models import (
    Approval,
    AuditEvent,
    Command,
    Epoch,
    Occurrence,
    Proposal,
    Tenant,
    ToolContract,
)
from approvals.web.selectors.history import HistoryCursor, HistoryWindow, occurrence_history
from reconciliation.models import (
    AdapterCredential,
    AdapterInvocation,
    EpochAdmission,
    Interruption,
    OperatorDecision,
)


def command_get_for_tenant(*, tenant: Tenant, command_id: uuid.UUID) -> Command | None:
    """A command with its invocations, interruptions and its occurrence's epochs (with
    what admitted each), in a fixed number of queries."""
    return (
        Command.objects.filter(tenant=tenant, pk=command_id)
        .select_related("occurrence__tool")
        .prefetch_related(
            Prefetch("invocations", queryset=AdapterInvocation.objects.order_by("number")),
            Prefetch("interruptions", queryset=Interruption.objects.order_by("created_at")),
            Prefetch(
                "occurrence__epochs",
                queryset=Epoch.objects.order_by("number").select_related("admission"),
            ),
        )
        .first()
    )


def epoch_admission(epoch: Epoch) -> EpochAdmission | None:
    try:
        return epoch.admission  # type: ignore[attr-defined,no-any-return]
    except EpochAdmission.DoesNotExist:
        return None


def command_detail(command: Command) -> dict[str, Any]:
    """The command as ``GET /api/v1/commands/{id}`` answers it."""
    invocations = list(command.invocations.all())  # type: ignore[attr-defined]
    epochs = list(command.occurrence.epochs.all())
    return {
        "command_id": str(command.pk),
        "occurrence_id": str(command.occurrence_id),
        "tool": command.occurrence.tool.name,
        "idempotency_key": command.idempotency_key,
        "execution_id": command.execution_id,
        "executed_by": command.executed_by,
        "state": command.state,
        "effect_state": command.effect_state,
        "created_at": command.created_at,
        "updated_at": command.updated_at,
        "invocation_count": len(invocations),
        "invocations": [
            {
                "number": i.number,
                "kind": i.kind,
                "epoch": next((e.number for e in epochs if e.pk == i.epoch_id), None),
                "justification": i.justification,
                "started_at": i.started_at,
                "finished_at": i.finished_at,
                "outcome": i.outcome or None,
                "receipt": i.receipt or None,
                "detail": i.detail or None,
            }
            for i in invocations
        ],
        "epochs": [
            {
                "number": e.number,
                "execution_id": e.execution_id,
                "justification": e.justification,
                "created_at": e.created_at,
                "admission": _admission_out(epoch_admission(e)),
            }
            for e in epochs
        ],
        "interruptions": [
            {
                "id": x.pk,
                "kind": x.kind,
                "epoch": next((e.number for e in epochs if e.pk == x.epoch_id), None),
                "challenges": x.challenges,
                "detail": x.detail or None,
                "created_at": x.created_at,
                "resolved_at": x.resolved_at,
            }
            for x in command.interruptions.all()  # type: ignore[attr-defined]
        ],
    }


def _admission_out(admission: EpochAdmission | None) -> dict[str, Any] | None:
    if admission is None:
        return None
    return {
        "justification": admission.justification,
        "basis": admission.basis,
        "decided_by": admission.decided_by,
        "reason": admission.reason or None,
        "interruption": admission.interruption_id,
        "created_at": admission.created_at,
    }


# --- the operators' queue ---------------------------------------------------------------


class Reason:
    """Why an item is in the queue: what a person must look at."""

    OUTCOME_UNKNOWN = "outcome_unknown"
    INTERRUPTED = "interrupted"
    EXPIRED_UNCLAIMED = "expired_unclaimed"
    STUCK_SENDING = "stuck_sending"
    STUCK_PENDING = "stuck_pending"

    LABELS = {
        OUTCOME_UNKNOWN: "Outcome unknown",
        INTERRUPTED: "Interrupted, waiting for credentials or a decision",
        EXPIRED_UNCLAIMED: "Approval expired unclaimed",
        STUCK_SENDING: "Stuck sending",
        STUCK_PENDING: "Stuck before dispatch",
    }
    ORDER = (OUTCOME_UNKNOWN, INTERRUPTED, STUCK_SENDING, STUCK_PENDING, EXPIRED_UNCLAIMED)


@dataclass(frozen=True)
class QueueItem:
    key: str  # stable across polls and escalations: "<reason>:<object id>"
    reason: str
    since: datetime  # when the item started needing a person
    occurrence: Occurrence
    command: Command | None

    @property
    def reason_label(self) -> str:
        return Reason.LABELS[self.reason]


# How many rows of each reason one page reads: the queue shows the oldest first, and a
# queue longer than this is an incident of its own (the counts say how long it is).
# Rows the queue lists, oldest first; its counts say how many there are in all.
QUEUE_LIMIT = 50


# Per reason, the field that says since when its rows need a person.
_SINCE = {
    Reason.OUTCOME_UNKNOWN: "updated_at",
    Reason.INTERRUPTED: "created_at",
    Reason.STUCK_SENDING: "updated_at",
    Reason.STUCK_PENDING: "updated_at",
    Reason.EXPIRED_UNCLAIMED: "expires_at",
}


def _queue_querysets(
    tenant_ids: list[int], now: datetime, tool_id: int | None
) -> dict[str, tuple[QuerySet[Any], str]]:
    """Per reason: the rows, and the field that says since when they need a person (what
    the compiled reads below run, with the values given: the tests' reference)."""
    values = _queue_values(tenant_ids, now, tool_id)
    return _reason_querysets(values["tenant_ids"], values["now"], values["stuck"], tool_id)


def _reason_querysets(
    tenant_ids: Any, now: Any, stuck: Any, tool_id: Any
) -> dict[str, tuple[QuerySet[Any], str]]:
    """``_queue_querysets`` with its values given, or with ``Param``s for them (the
    compiled reads below)."""
    commands = Command.objects.filter(tenant_id__in=tenant_ids)
    # Never claimed: a claim consumes the approval and creates its command in one
    # transaction, so an issued or expired approval has none, and the query need not
    # anti-join every command (which made PostgreSQL hash all of them): it reads the
    # approval_unclaimed_expiry index, oldest first.
    approvals = Approval.objects.filter(
        tenant_id__in=tenant_ids,
        # approval_unclaimed_expiry's condition, in the statement's text (compiled.Literal).
        state__in=literals([Approval.State.ISSUED, Approval.State.EXPIRED]),
        expires_at__lte=now,
        superseded_at__isnull=True,
    )
    interruptions = Interruption.objects.filter(
        command__tenant_id__in=tenant_ids, resolved_at__isnull=True
    )
    if tool_id is not None:
        commands = commands.filter(occurrence__tool_id=tool_id)
        approvals = approvals.filter(occurrence__tool_id=tool_id)
        interruptions = interruptions.filter(command__occurrence__tool_id=tool_id)
    querysets = {
        Reason.OUTCOME_UNKNOWN: commands.filter(state=Command.State.OUTCOME_UNKNOWN),
        Reason.INTERRUPTED: interruptions,
        Reason.STUCK_SENDING: commands.filter(state=Command.State.SENDING, updated_at__lt=stuck),
        Reason.STUCK_PENDING: commands.filter(
            state=Command.State.PENDING,
            executed_by=Command.ExecutedBy.CONSOLE,
            updated_at__lt=stuck,
        ),
        Reason.EXPIRED_UNCLAIMED: approvals,
    }
    return {reason: (queryset, _SINCE[reason]) for reason, queryset in querysets.items()}


def _queue_params(tenant_ids: int, by_tool: bool) -> dict[str, tuple[QuerySet[Any], str]]:
    """The queue's querysets with ``Param``s: ``tenant_ids``, ``now``, ``stuck`` (when a
    command counts as stuck) and, ``by_tool``, ``tool``."""
    return _reason_querysets(
        ParamList("tenant_ids", tenant_ids, Tenant._meta.pk),
        Param("now", _MOMENT),
        Param("stuck", _MOMENT),
        Param("tool", ToolContract._meta.pk) if by_tool else None,
    )


def _queue_values(tenant_ids: list[int], now: datetime, tool_id: int | None) -> dict[str, Any]:
    stuck = now - timedelta(seconds=settings.OPERATIONS_STUCK_SECONDS)
    return {"tenant_ids": tenant_ids, "now": now, "stuck": stuck, "tool": tool_id}


def _counts_statement(tenant_ids: int, by_tool: bool) -> tuple[str, list[Any]]:
    columns: list[str] = []
    params: list[Any] = []
    querysets = _queue_params(tenant_ids, by_tool)
    for reason in _REASONS:
        queryset, _ = querysets[reason]
        sql, reason_params = queryset.order_by().values("pk").query.sql_with_params()
        # ``reason`` is one of Reason's constants, never input.
        columns.append(f"(SELECT COUNT(*) FROM ({sql}) AS {reason}_items) AS {reason}")  # noqa: S608
        params.extend(reason_params)
    return f"SELECT {', '.join(columns)}", params


_QUEUE_COUNTS = CompiledStatement(_counts_statement)


def queue_counts(
    *, tenant_ids: list[int], now: datetime, tool_id: int | None = None
) -> dict[str, int]:
    """How many items of each reason, in one statement: each reason's count is a scalar
    subquery of its own, planned on its own index as a separate ``count()`` would be, but
    the page pays one round trip and one statement's overhead instead of five."""
    [row] = _QUEUE_COUNTS.rows(
        {"by_tool": tool_id is not None}, **_queue_values(tenant_ids, now, tool_id)
    )
    return {reason: int(n) for reason, n in zip(_REASONS, row, strict=True)}


def _items_of(name: str, tenant_ids: int, by_tool: bool, limit: int) -> QuerySet[Any]:
    queryset, since_field = _queue_params(tenant_ids, by_tool)[name]
    if name == Reason.INTERRUPTED:
        queryset = queryset.select_related(
            "command__occurrence__tool", "command__occurrence__tenant"
        ).defer(*(f"command__occurrence__tool__{f}" for f in _TOOL_UNSHOWN))
    else:
        queryset = queryset.select_related("occurrence__tool", "occurrence__tenant").defer(
            *(f"occurrence__tool__{f}" for f in _TOOL_UNSHOWN)
        )
    return queryset.order_by(since_field)[:limit]


_MOMENT: DateTimeField[Any, Any] = DateTimeField()
# A queue row shows a tool's name, never its schema or description.
_TOOL_UNSHOWN = ("json_schema", "description")
# The order of the counts' columns and of the items' reads.
_REASONS = (
    Reason.OUTCOME_UNKNOWN,
    Reason.INTERRUPTED,
    Reason.STUCK_SENDING,
    Reason.STUCK_PENDING,
    Reason.EXPIRED_UNCLAIMED,
)
_QUEUE_ITEMS = {
    (name, by_tool): Compiled[Any](
        lambda tenant_ids, limit, name=name, by_tool=by_tool: _items_of(
            name, tenant_ids, by_tool, limit
        )
    )
    for name in _REASONS
    for by_tool in (False, True)
}
_CURRENT_PROPOSALS = Compiled[Proposal](
    lambda: Proposal.objects.filter(
        occurrence_id__in=ParamArray("occurrences", Occurrence._meta.pk), is_current=True
    )
)


def queue_items(
    *,
    tenant_ids: list[int],
    now: datetime,
    reason: str = "",
    tool_id: int | None = None,
    limit: int | None = None,
    counts: dict[str, int] | None = None,
) -> list[QueueItem]:
    """What needs a person, oldest first: one query per reason, with the occurrence, its
    tool and tenant, then the current proposals of them all (for the amount read for
    people). Given the ``queue_counts`` just read, a reason with nothing in it is not asked
    again."""
    limit = QUEUE_LIMIT if limit is None else limit
    values = _queue_values(tenant_ids, now, tool_id)
    by_tool = tool_id is not None
    items: list[QueueItem] = []
    for name in _REASONS:
        if (reason and name != reason) or (counts is not None and not counts.get(name)):
            continue
        rows = _QUEUE_ITEMS[name, by_tool].run({"limit": limit}, **values)
        if name == Reason.INTERRUPTED:
            items += [
                QueueItem(
                    f"{name}:{row.pk}", name, row.created_at, row.command.occurrence, row.command
                )
                for row in rows
            ]
            continue
        since_field = _SINCE[name]
        for row in rows:
            command = row if isinstance(row, Command) else None
            items.append(
                QueueItem(
                    f"{name}:{row.pk}", name, getattr(row, since_field), row.occurrence, command
                )
            )
    items.sort(key=lambda item: item.since)
    items = items[:limit]
    current: dict[Any, list[Proposal]] = {item.occurrence.pk: [] for item in items}
    if current:
        for proposal in _CURRENT_PROPOSALS.run(occurrences=list(current)):
            current[proposal.occurrence_id].append(proposal)
    for item in items:
        item.occurrence.current_proposals = current[item.occurrence.pk]  # type: ignore[attr-defined]
    return items


def queue_item_arguments(item: QueueItem) -> dict[str, Any]:
    proposals = getattr(item.occurrence, "current_proposals", [])
    return proposals[0].arguments if proposals else {}


# --- the occurrence timeline ------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    kind: str  # an audit kind, or "invocation"
    event: AuditEvent | None
    invocation: AdapterInvocation | None


@dataclass(frozen=True)
class Timeline:
    occurrence: Occurrence
    # One window of the audit events (``history``) merged with the adapter invocations
    # that started within its span, ordered by time.
    entries: list[TimelineEntry]
    history: HistoryWindow
    total_events: int
    commands: list[Command]
    epochs: list[Epoch]
    invocations: list[AdapterInvocation]
    interruptions: list[Interruption]
    decisions: list[OperatorDecision]
    approvals: list[Approval]
    credential_refreshed_at: datetime | None


def timeline_get(
    *,
    occurrence_id: uuid.UUID,
    tenant_ids: list[int],
    cursor: HistoryCursor | None = None,
) -> Timeline | None:
    """Everything recorded about one occurrence, in a fixed number of queries: its audit
    events one window at a time (the newest unless ``cursor`` names another, as on the
    review page), every other record whole."""
    found = _TIMELINE.run(pk=occurrence_id, tenant_ids=tenant_ids) if tenant_ids else []
    if not found:
        return None
    [occurrence] = found
    prefetched(occurrence, "proposals", _TIMELINE_PROPOSALS.run(occurrence=occurrence.pk))
    prefetched(occurrence, "approvals", _TIMELINE_APPROVALS.run(occurrence=occurrence.pk))
    prefetched(occurrence, "epochs", _TIMELINE_EPOCHS.run(occurrence=occurrence.pk))
    commands = _TIMELINE_COMMANDS.run(occurrence=occurrence.pk)
    command_ids = [c.pk for c in commands]
    invocations = _TIMELINE_INVOCATIONS.run(command_ids=command_ids)
    interruptions = _TIMELINE_INTERRUPTIONS.run(command_ids=command_ids)
    decisions = _TIMELINE_DECISIONS.run(command_ids=command_ids)
    admissions = {a.epoch_id: a for a in _TIMELINE_ADMISSIONS.run(command_ids=command_ids)}
    epochs = list(occurrence.epochs.all())
    for epoch in epochs:
        epoch.admission_record = admissions.get(epoch.pk)  # type: ignore[attr-defined]
    total = sum(_TIMELINE_EVENTS.run(occurrence=occurrence.pk))
    window = occurrence_history(occurrence, cursor or HistoryCursor(), total=total)
    entries = [TimelineEntry(e.source_time, e.kind, e, None) for e in window.events]
    entries += [
        TimelineEntry(i.started_at, "invocation", None, i)
        for i in _invocations_in_window(invocations, window)
    ]
    entries.sort(key=lambda entry: (entry.at, entry.event.pk if entry.event else 0))
    adapter = occurrence.tool.adapter
    refreshed = (
        next(iter(_CREDENTIAL_REFRESHED.run(tenant=occurrence.tenant_id, adapter=adapter)), None)
        if adapter
        else None
    )
    return Timeline(
        occurrence=occurrence,
        entries=entries,
        history=window,
        total_events=window.total,
        commands=commands,
        epochs=epochs,
        invocations=invocations,
        interruptions=interruptions,
        decisions=decisions,
        approvals=list(occurrence.approvals.all()),
        credential_refreshed_at=refreshed,
    )


def _invocations_in_window(
    invocations: list[AdapterInvocation], window: HistoryWindow
) -> list[AdapterInvocation]:
    """The invocations that started within the window's span: from its first event's time
    (the oldest window: from the beginning) up to, not including, the time of the first
    event after it (the newest window: without end). Adjacent windows share that bound, so
    paging through a history shows each invocation once, next to the events around it.
    One query for the bound, and none for the newest window."""
    if not window.events:  # nothing at all yet, or a cursor past either end
        return invocations if window.total == 0 else []
    start = window.events[0].source_time if window.earlier else None
    end = (
        next(
            iter(
                _NEXT_EVENT_TIME.run(
                    occurrence=window.events[-1].occurrence_id, id=window.events[-1].pk
                )
            ),
            None,
        )
        if window.later
        else None
    )
    return [
        i
        for i in invocations
        if (start is None or i.started_at >= start) and (end is None or i.started_at < end)
    ]


# --- the timeline's reads, compiled once per process (approvals.compiled) -----------------

_OCCURRENCE = Occurrence._meta.pk
_COMMAND = Command._meta.pk


def _of_commands(size: int) -> ParamList | list[Any]:
    """The commands' ids, or an empty list (which matches nothing, with no query)."""
    return ParamList("command_ids", size, _COMMAND) if size else []


_TIMELINE = Compiled[Occurrence](
    lambda tenant_ids: Occurrence.objects.filter(
        pk=Param("pk", _OCCURRENCE),
        tenant_id__in=ParamList("tenant_ids", tenant_ids, Tenant._meta.pk),
    ).select_related("tool", "tenant", "runtime_key")[:1]
)
_TIMELINE_PROPOSALS = Compiled[Proposal](
    lambda: Proposal.objects.filter(occurrence_id=Param("occurrence", _OCCURRENCE)).order_by(
        "version"
    )
)
_TIMELINE_APPROVALS = Compiled[Approval](
    lambda: (
        Approval.objects.filter(occurrence_id=Param("occurrence", _OCCURRENCE))
        .select_related("approver")
        .order_by("issued_at")
    )
)
_TIMELINE_EPOCHS = Compiled[Epoch](
    lambda: Epoch.objects.filter(occurrence_id=Param("occurrence", _OCCURRENCE)).order_by("number")
)
_TIMELINE_COMMANDS = Compiled[Command](
    lambda: Command.objects.filter(occurrence_id=Param("occurrence", _OCCURRENCE)).order_by(
        "created_at"
    )
)
_TIMELINE_INVOCATIONS = Compiled[AdapterInvocation](
    lambda command_ids: (
        AdapterInvocation.objects.filter(command_id__in=_of_commands(command_ids))
        .select_related("epoch")
        .order_by("command_id", "number")
    )
)
_TIMELINE_INTERRUPTIONS = Compiled[Interruption](
    lambda command_ids: Interruption.objects.filter(
        command_id__in=_of_commands(command_ids)
    ).order_by("created_at")
)
_TIMELINE_DECISIONS = Compiled[OperatorDecision](
    lambda command_ids: OperatorDecision.objects.filter(
        command_id__in=_of_commands(command_ids)
    ).order_by("created_at")
)
_TIMELINE_ADMISSIONS = Compiled[EpochAdmission](
    lambda command_ids: EpochAdmission.objects.filter(
        command_id__in=_of_commands(command_ids)
    ).select_related("interruption", "decision")
)
# How many audit events the occurrence has: a row with the count (none when it has none).
_TIMELINE_EVENTS = Compiled[int](
    lambda: (
        AuditEvent.objects.filter(occurrence_id=Param("occurrence", _OCCURRENCE))
        .order_by()
        .values("occurrence_id")
        .annotate(n=Count("id"))
        .values_list("n", flat=True)
    )
)
# When the event after a window's last happened (its time bounds the window's invocations).
_NEXT_EVENT_TIME = Compiled[datetime](
    lambda: (
        AuditEvent.objects.filter(
            occurrence_id=Param("occurrence", _OCCURRENCE),
            id__gt=Param("id", AuditEvent._meta.pk),
        )
        .order_by("id")
        .values_list("source_time", flat=True)[:1]
    )
)
_CREDENTIAL_REFRESHED = Compiled[datetime](
    lambda: AdapterCredential.objects.filter(
        tenant_id=Param("tenant", Tenant._meta.pk),
        adapter=Param("adapter", AdapterCredential._meta.get_field("adapter")),
    ).values_list("updated_at", flat=True)[:1]
)
