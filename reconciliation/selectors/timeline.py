"""An occurrence's timeline for operators: its versions, approvals, epochs, commands,
invocations, interruptions and decisions beside a window of its audit events."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count

from approvals.compiled import (
    Compiled,
    Param,
    ParamList,
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
)
from approvals.web.selectors.history import HistoryCursor, HistoryWindow, occurrence_history
from reconciliation.models import (
    AdapterCredential,
    AdapterInvocation,
    EpochAdmission,
    Interruption,
    OperatorDecision,
)


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
