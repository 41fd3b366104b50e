"""The operators' queue: what needs a person (outcome unknown, interrupted, stuck before or
during dispatch, admitted and waiting), counted per reason and listed oldest first."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import DateTimeField, QuerySet

from approvals.compiled import (
    Compiled,
    CompiledStatement,
    Param,
    ParamArray,
    ParamList,
    literals,
)
from approvals.models import (
    Approval,
    Command,
    Occurrence,
    Proposal,
    Tenant,
    ToolContract,
)
from reconciliation.models import (
    Interruption,
)


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
