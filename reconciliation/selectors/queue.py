"""The operators' queue: what needs a person (outcome unknown, interrupted, stuck before or
during dispatch, admitted and waiting), counted per reason and listed oldest first, each
item with who is on it ("I'm on it", ``reconciliation.takes``), and filtered by that
(``Owner``: mine, unowned) in the same statements."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from approvals.models import (
    Approval,
    Command,
    Occurrence,
    Proposal,
    Tenant,
    ToolContract,
)
from approvals.sql import Columns, fetch, on_postgresql, split, words
from approvals.vocabulary import QUEUE_REASONS, QueueReason
from reconciliation.models import EpochAdmission, Interruption, QueueTake
from reconciliation.takes import Holder, holder_of


@dataclass(frozen=True)
class Owner:
    """The queue's owner filter: ``mine`` (items ``user_id`` is on) or ``unowned`` (items
    nobody is on, a lapsed take counted as nobody's; whose filter it is does not matter)."""

    MINE = "mine"
    UNOWNED = "unowned"
    CHOICES = (("", "All"), (MINE, "Mine"), (UNOWNED, "Unowned"))

    mode: str
    user_id: int = 0


@dataclass(frozen=True)
class QueueItem:
    key: str  # stable across polls and escalations: "<reason>:<object id>"
    reason: str
    since: datetime  # when the item started needing a person
    occurrence: Occurrence
    command: Command | None
    holder: Holder | None = None  # who is on it ("I'm on it"), None: nobody

    @property
    def reason_label(self) -> str:
        return QueueReason(self.reason).label


# How many rows of each reason one page reads: the queue shows the oldest first, and a
# queue longer than this is an incident of its own (the counts say how long it is).
# Rows the queue lists, oldest first; its counts say how many there are in all.
QUEUE_LIMIT = 50


# Per reason, the field that says since when its rows need a person.
_SINCE: dict[str, str] = {
    QueueReason.OUTCOME_UNKNOWN: "updated_at",
    QueueReason.INTERRUPTED: "created_at",
    QueueReason.STUCK_SENDING: "updated_at",
    QueueReason.STUCK_PENDING: "updated_at",
    QueueReason.WAITING_FOR_RUNTIME: "updated_at",
    QueueReason.EXPIRED_UNCLAIMED: "expires_at",
}


def _queue_querysets(
    tenant_ids: list[int],
    now: datetime,
    tool_id: int | None,
    occurrence_ids: list[Any] | None = None,
    owner: Owner | None = None,
) -> dict[str, tuple[QuerySet[Any], str]]:
    """Per reason: the rows (the ORM twin of the statements below, which SQLite runs and
        the tests hold them equal to), and the field that says since when they need a
        person. ``occurrence_ids``: only theirs (a search's answer, ``queue_search``); ``owner``:
    only those the user is on, or those nobody is on."""
    stuck = _stuck(now)
    commands = Command.objects.filter(tenant_id__in=tenant_ids)
    # Never claimed: a claim consumes the approval and creates its command in one
    # transaction, so an issued or expired approval has none, and the query need not
    # anti-join every command (which made PostgreSQL hash all of them): it reads the
    # approval_unclaimed_expiry index, oldest first.
    approvals = Approval.objects.filter(
        tenant_id__in=tenant_ids,
        state__in=_UNCLAIMED,
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
    if occurrence_ids is not None:
        commands = commands.filter(occurrence_id__in=occurrence_ids)
        approvals = approvals.filter(occurrence_id__in=occurrence_ids)
        interruptions = interruptions.filter(command__occurrence_id__in=occurrence_ids)
    if owner is not None:
        commands = commands.filter(_owned(owner, "occurrence_id"))
        approvals = approvals.filter(_owned(owner, "occurrence_id"))
        interruptions = interruptions.filter(_owned(owner, "command__occurrence_id"))
    querysets = {
        QueueReason.OUTCOME_UNKNOWN: commands.filter(state=Command.State.OUTCOME_UNKNOWN),
        QueueReason.INTERRUPTED: interruptions,
        QueueReason.STUCK_SENDING: commands.filter(
            state=Command.State.SENDING, updated_at__lt=_stuck_sending(now)
        ),
        QueueReason.STUCK_PENDING: commands.filter(
            state=Command.State.PENDING,
            executed_by=Command.ExecutedBy.CONSOLE,
            updated_at__lt=stuck,
        ),
        # Not sent, and an operator admitted another attempt: the runtime that executes
        # it has yet to run it again and report (until it does, nothing happens).
        QueueReason.WAITING_FOR_RUNTIME: commands.filter(
            state=Command.State.PENDING,
            executed_by=Command.ExecutedBy.RUNTIME,
            pk__in=EpochAdmission.objects.filter(decision__isnull=False).values("command_id"),
        ),
        QueueReason.EXPIRED_UNCLAIMED: approvals,
    }
    return {reason: (queryset, _SINCE[reason]) for reason, queryset in querysets.items()}


def _owned(owner: Owner, occurrence_field: str) -> Any:
    """The ORM twin of ``_OWNED_SQL``: the owner filter on a reason's rows."""
    live = QueueTake.objects.filter(
        occurrence_id=OuterRef(occurrence_field), holder__isnull=False, expires_at__gt=Now()
    )
    if owner.mode == Owner.MINE:
        return Exists(live.filter(holder_id=owner.user_id))
    return ~Exists(live)


def _stuck(now: datetime) -> datetime:
    """Commands unchanged since before this count as stuck."""
    return now - timedelta(seconds=settings.OPERATIONS_STUCK_SECONDS)


def _stuck_sending(now: datetime) -> datetime:
    """Sending since before this: stuck, and sooner than ``_stuck`` says when no call can
    still be in flight (``DISPATCH_STUCK_SENDING_SECONDS``, after which the outbox sweep
    delivers it again): its worker died."""
    seconds = min(settings.OPERATIONS_STUCK_SECONDS, settings.DISPATCH_STUCK_SENDING_SECONDS)
    return now - timedelta(seconds=seconds)


_UNCLAIMED = (Approval.State.ISSUED, Approval.State.EXPIRED)

# Per reason: the table its rows come from (with the alias its condition uses), the
# condition (with %s for the tenants, then "now", "stuck" or "stuck_sending" as named in the
# values), the values after the tenants, and the column that says since when. The
# console's own words are in the text: a partial index (approval_unclaimed_expiry) serves a
# prepared statement's generic plan only if the statement's text implies its condition.
_REASON_SQL: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    QueueReason.OUTCOME_UNKNOWN: (
        "approvals_command x",
        f"x.tenant_id = ANY(%s) AND x.state = '{Command.State.OUTCOME_UNKNOWN}'",
        (),
        "x.updated_at",
    ),
    QueueReason.INTERRUPTED: (
        "reconciliation_interruption x JOIN approvals_command c ON c.id = x.command_id",
        "c.tenant_id = ANY(%s) AND x.resolved_at IS NULL",
        (),
        "x.created_at",
    ),
    QueueReason.STUCK_SENDING: (
        "approvals_command x",
        f"x.tenant_id = ANY(%s) AND x.state = '{Command.State.SENDING}' AND x.updated_at < %s",
        ("stuck_sending",),
        "x.updated_at",
    ),
    QueueReason.STUCK_PENDING: (
        "approvals_command x",
        f"x.tenant_id = ANY(%s) AND x.state = '{Command.State.PENDING}'"
        f" AND x.executed_by = '{Command.ExecutedBy.CONSOLE}' AND x.updated_at < %s",
        ("stuck",),
        "x.updated_at",
    ),
    QueueReason.WAITING_FOR_RUNTIME: (
        "approvals_command x",
        f"x.tenant_id = ANY(%s) AND x.state = '{Command.State.PENDING}'"  # noqa: S608 (no input)
        f" AND x.executed_by = '{Command.ExecutedBy.RUNTIME}'"
        " AND EXISTS (SELECT 1 FROM reconciliation_epochadmission a"
        " WHERE a.command_id = x.id AND a.decision_id IS NOT NULL)",
        (),
        "x.updated_at",
    ),
    QueueReason.EXPIRED_UNCLAIMED: (
        "approvals_approval x",
        f"x.tenant_id = ANY(%s) AND x.state IN ({words(_UNCLAIMED)})"
        " AND x.expires_at <= %s AND x.superseded_at IS NULL",
        ("now",),
        "x.expires_at",
    ),
}
# The occurrence a reason's row belongs to, for the tool filter and the items.
_OCCURRENCE_OF: dict[str, str] = {
    QueueReason.OUTCOME_UNKNOWN: "x.occurrence_id",
    QueueReason.INTERRUPTED: "c.occurrence_id",
    QueueReason.STUCK_SENDING: "x.occurrence_id",
    QueueReason.STUCK_PENDING: "x.occurrence_id",
    QueueReason.WAITING_FOR_RUNTIME: "x.occurrence_id",
    QueueReason.EXPIRED_UNCLAIMED: "x.occurrence_id",
}


# The owner filter, by the database's clock (a take lapses at its ``expires_at``).
_LIVE_TAKE = (
    "SELECT 1 FROM reconciliation_queuetake k WHERE k.occurrence_id = {occurrence}"
    " AND k.holder_id IS NOT NULL AND k.expires_at > CURRENT_TIMESTAMP"
)
_OWNED_SQL = {
    Owner.MINE: f" AND EXISTS ({_LIVE_TAKE} AND k.holder_id = %s)",
    Owner.UNOWNED: f" AND NOT EXISTS ({_LIVE_TAKE})",
}


def _reason_sql(name: str, by_tool: bool, values: dict[str, Any]) -> tuple[str, str, list[Any]]:
    """A reason's FROM and WHERE clauses (the tool's filter joins the occurrence), and
    their values."""
    table, condition, named, _ = _REASON_SQL[name]
    params: list[Any] = [values["tenant_ids"], *(values[n] for n in named)]
    if by_tool:
        table += f" JOIN approvals_occurrence ot ON ot.id = {_OCCURRENCE_OF[name]}"
        condition += " AND ot.tool_id = %s"
        params.append(values["tool"])
    if values.get("occurrences") is not None:
        condition += f" AND {_OCCURRENCE_OF[name]} = ANY(%s)"
        params.append(values["occurrences"])
    owner: Owner | None = values.get("owner")
    if owner is not None:
        condition += _OWNED_SQL[owner.mode].format(occurrence=_OCCURRENCE_OF[name])
        if owner.mode == Owner.MINE:
            params.append(owner.user_id)
    return table, condition, params


def queue_counts(
    *,
    tenant_ids: list[int],
    now: datetime,
    tool_id: int | None = None,
    occurrence_ids: list[Any] | None = None,
    owner: Owner | None = None,
) -> dict[str, int]:
    """How many items of each reason, in one statement: each reason's count is a scalar
    subquery of its own, planned on its own index as a separate ``count()`` would be, but
    the page pays one round trip and one statement's overhead instead of five."""
    if not on_postgresql():
        return {
            reason: queryset.count()
            for reason, (queryset, _) in _queue_querysets(
                tenant_ids, now, tool_id, occurrence_ids, owner
            ).items()
        }
    values = {
        "tenant_ids": tenant_ids,
        "now": now,
        "stuck": _stuck(now),
        "stuck_sending": _stuck_sending(now),
        "tool": tool_id,
        "occurrences": occurrence_ids,
        "owner": owner,
    }
    columns, params = [], []
    for name in QUEUE_REASONS:
        table, condition, reason_params = _reason_sql(name, tool_id is not None, values)
        columns.append(f"(SELECT COUNT(*) FROM {table} WHERE {condition})")  # noqa: S608
        params += reason_params
    [row] = fetch(f"SELECT {', '.join(columns)}", params)
    return {reason: int(n) for reason, n in zip(QUEUE_REASONS, row, strict=True)}


# A queue row shows a tool's name, never its schema or description.
_TOOL_UNSHOWN = ("json_schema", "description")
_ROW: dict[str, Columns] = {
    QueueReason.OUTCOME_UNKNOWN: Columns(Command, "x"),
    QueueReason.INTERRUPTED: Columns(Interruption, "x"),
    QueueReason.STUCK_SENDING: Columns(Command, "x"),
    QueueReason.STUCK_PENDING: Columns(Command, "x"),
    QueueReason.WAITING_FOR_RUNTIME: Columns(Command, "x"),
    QueueReason.EXPIRED_UNCLAIMED: Columns(Approval, "x"),
}
_COMMAND = Columns(Command, "c")
_OCCURRENCE = Columns(Occurrence, "o")
_TOOL = Columns(ToolContract, "t", defer=_TOOL_UNSHOWN)
_TENANT = Columns(Tenant, "n")
_TAKE = Columns(QueueTake, "h")


def _items_sql(name: str, by_tool: bool, values: dict[str, Any]) -> tuple[str, list[Any]]:
    """A reason's oldest rows (``LIMIT %s``), each with its occurrence, tool and tenant
    (and, for an interruption, its command), and its live take if anyone is on it."""
    table, condition, params = _reason_sql(name, by_tool, values)
    command = f", {_COMMAND.sql}" if name == QueueReason.INTERRUPTED else ""
    since = _REASON_SQL[name][3]
    sql = f"""SELECT {_ROW[name].sql}{command}, {_OCCURRENCE.sql}, {_TOOL.sql}, {_TENANT.sql},
                     {_TAKE.sql}
                FROM {table}
                JOIN approvals_occurrence o ON o.id = {_OCCURRENCE_OF[name]}
                JOIN approvals_toolcontract t ON t.id = o.tool_id
                JOIN approvals_tenant n ON n.id = o.tenant_id
                LEFT JOIN reconciliation_queuetake h ON h.occurrence_id = o.id
                     AND h.holder_id IS NOT NULL AND h.expires_at > CURRENT_TIMESTAMP
               WHERE {condition}
               ORDER BY {since}, x.id
               LIMIT %s"""  # noqa: S608 (no input in the text)
    return sql, params


def _items_of(name: str, values: dict[str, Any], limit: int) -> list[Any]:
    """A reason's oldest rows: a command, an interruption or an approval, each with its
    occurrence (whose tool and tenant are set, and ``queue_holder``: who is on it)."""
    if not on_postgresql():
        queryset, since_field = _queue_querysets(
            values["tenant_ids"],
            values["now"],
            values["tool"],
            values["occurrences"],
            values["owner"],
        )[name]
        prefix = "command__occurrence" if name == QueueReason.INTERRUPTED else "occurrence"
        queryset = queryset.select_related(
            f"{prefix}__tool", f"{prefix}__tenant", f"{prefix}__take"
        ).defer(*(f"{prefix}__tool__{f}" for f in _TOOL_UNSHOWN))
        # Ties (two rows changed at one instant) in the order of their ids, as the SQL's.
        rows = list(queryset.order_by(since_field, "pk")[:limit])
        for row in rows:
            occurrence = (
                row.command.occurrence if name == QueueReason.INTERRUPTED else row.occurrence
            )
            take = getattr(occurrence, "take", None) if _has_take(occurrence) else None
            # SQLite runs in this process: its clock is this process's (``db_now``).
            occurrence.queue_holder = holder_of(take, timezone.now())
        return rows
    sql, params = _items_sql(name, values["tool"] is not None, values)
    rows = []
    for row in fetch(sql, [*params, limit]):
        if name == QueueReason.INTERRUPTED:
            item, command, occurrence, tool, tenant, take = split(
                row, _ROW[name], _COMMAND, _OCCURRENCE, _TOOL, _TENANT, _TAKE
            )
            item.command, command.occurrence = command, occurrence
        else:
            item, occurrence, tool, tenant, take = split(
                row, _ROW[name], _OCCURRENCE, _TOOL, _TENANT, _TAKE
            )
            item.occurrence = occurrence
        occurrence.tool, occurrence.tenant = tool, tenant
        # The join kept only a live take (by the database's clock).
        occurrence.queue_holder = (
            Holder(take.holder_id, take.holder_name, take.taken_at, take.expires_at)
            if take is not None
            else None
        )
        rows.append(item)
    return rows


def _has_take(occurrence: Occurrence) -> bool:
    try:
        occurrence.take  # type: ignore[attr-defined]  # noqa: B018 (select_related's cache)
    except QueueTake.DoesNotExist:
        return False
    return True


_CURRENT_PROPOSAL = Columns(Proposal, "p")
_CURRENT_PROPOSALS = f"""
SELECT {_CURRENT_PROPOSAL.sql} FROM approvals_proposal p
 WHERE p.occurrence_id = ANY(%s) AND p.is_current"""  # noqa: S608


def _current_proposals(occurrence_ids: list[Any]) -> list[Proposal]:
    if on_postgresql():
        return [_CURRENT_PROPOSAL.load(row) for row in fetch(_CURRENT_PROPOSALS, [occurrence_ids])]
    return list(Proposal.objects.filter(occurrence_id__in=occurrence_ids, is_current=True))


def queue_items(
    *,
    tenant_ids: list[int],
    now: datetime,
    reason: str = "",
    tool_id: int | None = None,
    limit: int | None = None,
    counts: dict[str, int] | None = None,
    occurrence_ids: list[Any] | None = None,
    owner: Owner | None = None,
) -> list[QueueItem]:
    """What needs a person, oldest first: one query per reason, with the occurrence, its
    tool and tenant, then the current proposals of them all (for the amount read for
    people). Given the ``queue_counts`` just read, a reason with nothing in it is not asked
    again. ``occurrence_ids``: only theirs (a search's answer); ``owner``: mine or unowned."""
    limit = QUEUE_LIMIT if limit is None else limit
    values = {
        "tenant_ids": tenant_ids,
        "now": now,
        "stuck": _stuck(now),
        "stuck_sending": _stuck_sending(now),
        "tool": tool_id,
        "occurrences": occurrence_ids,
        "owner": owner,
    }
    items: list[QueueItem] = []
    for name in QUEUE_REASONS:
        if (reason and name != reason) or (counts is not None and not counts.get(name)):
            continue
        rows = _items_of(name, values, limit)
        if name == QueueReason.INTERRUPTED:
            items += [
                QueueItem(
                    f"{name}:{row.pk}",
                    name,
                    row.created_at,
                    row.command.occurrence,
                    row.command,
                    row.command.occurrence.queue_holder,
                )
                for row in rows
            ]
            continue
        since_field = _SINCE[name]
        for row in rows:
            command = row if isinstance(row, Command) else None
            items.append(
                QueueItem(
                    f"{name}:{row.pk}",
                    name,
                    getattr(row, since_field),
                    row.occurrence,
                    command,
                    row.occurrence.queue_holder,
                )
            )
    items.sort(key=lambda item: item.since)
    items = items[:limit]
    current: dict[Any, list[Proposal]] = {item.occurrence.pk: [] for item in items}
    if current:
        for proposal in _current_proposals(list(current)):
            current[proposal.occurrence_id].append(proposal)
    for item in items:
        item.occurrence.current_proposals = current[item.occurrence.pk]  # type: ignore[attr-defined]
    return items


def queue_item_arguments(item: QueueItem) -> dict[str, Any]:
    proposals = getattr(item.occurrence, "current_proposals", [])
    return proposals[0].arguments if proposals else {}
