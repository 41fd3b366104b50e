"""An occurrence's timeline for operators: its versions, approvals, epochs, commands,
invocations, interruptions and decisions beside a window of its audit events."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from approvals.models import (
    Approval,
    AuditEvent,
    Command,
    Epoch,
    Occurrence,
    Proposal,
    RuntimeKey,
    Tenant,
    ToolContract,
)
from approvals.sql import Columns, fetch, on_postgresql, split
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
    proposals: list[Proposal]
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
    occurrence = _occurrence(occurrence_id, tenant_ids) if tenant_ids else None
    if occurrence is None:
        return None
    records = _records(occurrence.pk)
    epochs = records["epochs"]
    epoch_of = {epoch.pk: epoch for epoch in epochs}
    for invocation in records["invocations"]:
        invocation.epoch = epoch_of[invocation.epoch_id]
    admissions = {a.epoch_id: a for a in records["admissions"]}
    for epoch in epochs:
        epoch.admission_record = admissions.get(epoch.pk)  # type: ignore[attr-defined]
    window = occurrence_history(occurrence, cursor or HistoryCursor(), total=records["total"])
    entries = [TimelineEntry(e.source_time, e.kind, e, None) for e in window.events]
    entries += [
        TimelineEntry(i.started_at, "invocation", None, i)
        for i in _invocations_in_window(records["invocations"], window)
    ]
    entries.sort(key=lambda entry: (entry.at, entry.event.pk if entry.event else 0))
    adapter = occurrence.tool.adapter
    return Timeline(
        occurrence=occurrence,
        entries=entries,
        history=window,
        total_events=window.total,
        proposals=records["proposals"],
        commands=records["commands"],
        epochs=epochs,
        invocations=records["invocations"],
        interruptions=records["interruptions"],
        decisions=records["decisions"],
        approvals=records["approvals"],
        credential_refreshed_at=_credential_refreshed(occurrence.tenant_id, adapter)
        if adapter
        else None,
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
    last = window.events[-1]
    end = _next_event_time(last.occurrence_id, last.pk) if window.later else None  # type: ignore[arg-type]
    return [
        i
        for i in invocations
        if (start is None or i.started_at >= start) and (end is None or i.started_at < end)
    ]


_OCCURRENCE = Columns(Occurrence, "o")
_TOOL = Columns(ToolContract, "t")
_TENANT = Columns(Tenant, "n")
_KEY = Columns(RuntimeKey, "k")

_OCCURRENCE_SQL = f"""
SELECT {_OCCURRENCE.sql}, {_TOOL.sql}, {_TENANT.sql}, {_KEY.sql}
  FROM approvals_occurrence o
  JOIN approvals_toolcontract t ON t.id = o.tool_id
  JOIN approvals_tenant n ON n.id = o.tenant_id
  LEFT JOIN approvals_runtimekey k ON k.id = o.runtime_key_id
 WHERE o.id = %s AND o.tenant_id = ANY(%s)"""  # noqa: S608 (no input in the text)


def _occurrence(occurrence_id: uuid.UUID, tenant_ids: list[int]) -> Occurrence | None:
    """The occurrence with its tool, tenant and runtime key, if it is of ``tenant_ids``."""
    if not on_postgresql():
        return (
            Occurrence.objects.filter(pk=occurrence_id, tenant_id__in=tenant_ids)
            .select_related("tool", "tenant", "runtime_key")
            .first()
        )
    rows = fetch(_OCCURRENCE_SQL, [occurrence_id, tenant_ids])
    if not rows:
        return None
    occurrence, tool, tenant, key = split(rows[0], _OCCURRENCE, _TOOL, _TENANT, _KEY)
    occurrence.tool, occurrence.tenant, occurrence.runtime_key = tool, tenant, key
    return occurrence


# The occurrence's records, each whole: (model, the statement's FROM and WHERE, ORDER BY).
# The commands' records are found through the commands of the occurrence.
_OF_COMMANDS = "x.command_id IN (SELECT c.id FROM approvals_command c WHERE c.occurrence_id = %s)"
_RECORDS: dict[str, tuple[type[Any], str, str]] = {
    "proposals": (Proposal, "approvals_proposal x WHERE x.occurrence_id = %s", "x.version"),
    "approvals": (Approval, "approvals_approval x WHERE x.occurrence_id = %s", "x.issued_at"),
    "epochs": (Epoch, "approvals_epoch x WHERE x.occurrence_id = %s", "x.number"),
    "commands": (Command, "approvals_command x WHERE x.occurrence_id = %s", "x.created_at"),
    "invocations": (
        AdapterInvocation,
        f"reconciliation_adapterinvocation x WHERE {_OF_COMMANDS}",
        "x.command_id, x.number",
    ),
    "interruptions": (
        Interruption,
        f"reconciliation_interruption x WHERE {_OF_COMMANDS}",
        "x.created_at",
    ),
    "decisions": (
        OperatorDecision,
        f"reconciliation_operatordecision x WHERE {_OF_COMMANDS}",
        "x.created_at",
    ),
    "admissions": (
        EpochAdmission,
        f"reconciliation_epochadmission x WHERE {_OF_COMMANDS}",
        "x.id",
    ),
}
_RECORD_COLUMNS = {name: Columns(model, "x") for name, (model, _, _) in _RECORDS.items()}
_RECORD_SQL = {
    name: f"SELECT {_RECORD_COLUMNS[name].sql} FROM {where} ORDER BY {order}"  # noqa: S608
    for name, (_, where, order) in _RECORDS.items()
}
_TOTAL_SQL = "SELECT COUNT(*) FROM approvals_auditevent e WHERE e.occurrence_id = %s"


def _records(occurrence_id: uuid.UUID) -> dict[str, Any]:
    """Every record of the occurrence by kind (and ``total``: how many audit events it
    has), one statement each."""
    if not on_postgresql():
        return {**_records_queryset(occurrence_id), "total": _events_total(occurrence_id)}
    records: dict[str, Any] = {
        name: [_RECORD_COLUMNS[name].load(row) for row in fetch(sql, [occurrence_id])]
        for name, sql in _RECORD_SQL.items()
    }
    records["total"] = int(fetch(_TOTAL_SQL, [occurrence_id])[0][0])
    return records


def _events_total(occurrence_id: uuid.UUID) -> int:
    return AuditEvent.objects.filter(occurrence_id=occurrence_id).count()


def _records_queryset(occurrence_id: uuid.UUID) -> dict[str, list[Any]]:
    """The ORM twin of ``_RECORD_SQL``."""
    of_commands = Command.objects.filter(occurrence_id=occurrence_id).values("pk")
    return {
        "proposals": list(Proposal.objects.filter(occurrence_id=occurrence_id).order_by("version")),
        "approvals": list(
            Approval.objects.filter(occurrence_id=occurrence_id).order_by("issued_at")
        ),
        "epochs": list(Epoch.objects.filter(occurrence_id=occurrence_id).order_by("number")),
        "commands": list(
            Command.objects.filter(occurrence_id=occurrence_id).order_by("created_at")
        ),
        "invocations": list(
            AdapterInvocation.objects.filter(command_id__in=of_commands).order_by(
                "command_id", "number"
            )
        ),
        "interruptions": list(
            Interruption.objects.filter(command_id__in=of_commands).order_by("created_at")
        ),
        "decisions": list(
            OperatorDecision.objects.filter(command_id__in=of_commands).order_by("created_at")
        ),
        "admissions": list(
            EpochAdmission.objects.filter(command_id__in=of_commands).order_by("pk")
        ),
    }


_NEXT_EVENT_TIME = """
SELECT e.source_time FROM approvals_auditevent e
 WHERE e.occurrence_id = %s AND e.id > %s
 ORDER BY e.id
 LIMIT 1"""


def _next_event_time(occurrence_id: uuid.UUID, event_id: int) -> datetime | None:
    """When the event after ``event_id`` happened (its time bounds a window's invocations)."""
    if on_postgresql():
        rows = fetch(_NEXT_EVENT_TIME, [occurrence_id, event_id])
        return rows[0][0] if rows else None
    return (
        AuditEvent.objects.filter(occurrence_id=occurrence_id, id__gt=event_id)
        .order_by("id")
        .values_list("source_time", flat=True)
        .first()
    )


_CREDENTIAL_REFRESHED = """
SELECT x.updated_at FROM reconciliation_adaptercredential x
 WHERE x.tenant_id = %s AND x.adapter = %s
 LIMIT 1"""


def _credential_refreshed(tenant_id: int, adapter: str) -> datetime | None:
    if on_postgresql():
        rows = fetch(_CREDENTIAL_REFRESHED, [tenant_id, adapter])
        return rows[0][0] if rows else None
    return (
        AdapterCredential.objects.filter(tenant_id=tenant_id, adapter=adapter)
        .values_list("updated_at", flat=True)
        .first()
    )
