"""What the operators' pages show, in words: the queue's rows and the three evidence
dimensions of an occurrence side by side, so that an operator sees why nothing runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import urlencode

from django.urls import reverse

from approvals.models import Approval, Command, Epoch
from approvals.reviews.selectors import approval_state
from approvals.vocabulary import (
    OPERATOR_PREFIX,
    QUEUE_REASONS,
    AuditKind,
    is_refused_use,
)
from approvals.web.links import occurrence_path
from approvals.web.money import MoneyLine, money_lines
from approvals.web.presenters.history import HistoryLink, history_caption, history_links
from approvals.web.shell import age
from reconciliation import adapters
from reconciliation.action_rules import allowed_actions, why_not
from reconciliation.models import OperatorDecision
from reconciliation.selectors.queue import QueueItem, queue_item_arguments
from reconciliation.selectors.timeline import Timeline
from reconciliation.takes import Holder


@dataclass(frozen=True)
class QueueRow:
    item: QueueItem
    age: str
    money: list[MoneyLine]
    identifiers: list[tuple[str, str]]  # (argument, value): agent-supplied, shown revealed
    on_it: str = ""  # "Rita is on it · 5 min", "" when nobody is
    mine: bool = False  # the viewer is on it

    @property
    def href(self) -> str:
        return occurrence_path("reconciliation:timeline", self.item.occurrence.pk)

    @property
    def take_url(self) -> str:
        return reverse("reconciliation:take", args=[self.item.occurrence.pk, "take"])

    @property
    def release_url(self) -> str:
        return reverse("reconciliation:take", args=[self.item.occurrence.pk, "release"])

    @property
    def link_id(self) -> str:
        """An id that outlives the poll's swap, which keeps the keyboard on this link
        (console.js)."""
        return "queue-link-" + self.item.key.replace(":", "-")

    @property
    def take_id(self) -> str:
        """The row's "I'm on it" / "Let go" button's id: the same for both, so that the
        keyboard stays on it across the poll's swap."""
        return "queue-take-" + self.item.key.replace(":", "-")


def on_it(holder: Holder | None, now: datetime, viewer_id: Any) -> str:
    """Who is on an item, in words: "Rita is on it · 5 min" ("You are on it" for oneself)."""
    if holder is None:
        return ""
    minutes = holder.minutes(now)
    who = "You are" if holder.user_id == viewer_id else f"{holder.name} is"
    return f"{who} on it · {f'{minutes} min' if minutes else 'just now'}"


def queue_rows(items: list[QueueItem], now: datetime, viewer_id: Any = None) -> list[QueueRow]:
    rows = []
    for item in items:
        arguments = queue_item_arguments(item)
        rows.append(
            QueueRow(
                item,
                age(item.since, now),
                money_lines(arguments),
                item.occurrence.tool.identifying(arguments),
                on_it(item.holder, now, viewer_id),
                item.holder is not None and item.holder.user_id == viewer_id,
            )
        )
    return rows


# The queue's sortable columns: the key of each (the age sorts by since when, oldest first).
QUEUE_SORTS: dict[str, Callable[[QueueRow], Any]] = {
    "age": lambda row: row.item.since,
    "reason": lambda row: QUEUE_REASONS.index(row.item.reason),
    "action": lambda row: (
        row.item.occurrence.tool.name,
        [value for _, value in row.identifiers],
    ),
    "amount": lambda row: [(line.currency, line.amount_minor) for line in row.money],
    "requester": lambda row: (row.item.occurrence.requested_by, row.item.occurrence.run_id),
}


def queue_sorted(rows: list[QueueRow], sort: str, descending: bool) -> list[QueueRow]:
    return sorted(rows, key=QUEUE_SORTS[sort], reverse=descending)


@dataclass(frozen=True)
class SortLink:
    column: str
    label: str
    url: str
    aria_sort: str  # "ascending", "descending" or "" (not the sorted column)


def queue_sort_links(base: str, sort: str, descending: bool) -> dict[str, SortLink]:
    """Each sortable column's header link: the sorted column flips its direction."""
    labels = {
        "age": "Waiting",
        "reason": "Reason",
        "action": "Action",
        "amount": "Amount",
        "requester": "Requested by",
    }
    links = {}
    for column, label in labels.items():
        current = column == sort
        flip = "asc" if current and descending else "desc" if current else "asc"
        url = f"{base}{'&' if '?' in base else '?'}sort={column}&dir={flip}"
        state = ("descending" if descending else "ascending") if current else ""
        links[column] = SortLink(column, label, url, state)
    return links


class Fact(NamedTuple):
    """One line of a dimension: an id among them leads to its investigation (``href``) and
    has a copy button (``copy_id``: the element the button copies)."""

    key: str
    value: str
    href: str = ""
    copy_id: str = ""


def _id_fact(key: str, value: str, slug: str) -> Fact:
    """An id that is no dead end: a link to what it names, and a copy button."""
    href = f"{reverse('reconciliation:investigations')}?{urlencode({'q': value})}"
    return Fact(key, value, href, f"fact-{slug}")


@dataclass(frozen=True)
class Dimension:
    title: str
    status: str  # one short phrase
    tone: str  # ok, wait, alarm
    facts: list[Fact] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # verbatim values (challenges)


@dataclass(frozen=True)
class ActionForm:
    action: str  # URL slug
    label: str
    help: str
    fields: list[str]  # extra fields besides the note


@dataclass(frozen=True)
class ActionForms:
    """The decisions the state allows (their forms), and the others with why not: the
    page offers only what the server accepts (``reconciliation.action_rules``)."""

    offered: list[ActionForm]
    withheld: list[tuple[str, str]]  # (label, why not)


def _latest_finding(decisions: list[OperatorDecision]) -> str:
    for decision in reversed(decisions):
        if decision.action in ("query_effect", "reconcile") and decision.finding:
            return decision.finding
    return ""


def dimensions(timeline: Timeline, now: datetime) -> list[Dimension]:
    """Recovery, authority and effect as they stand now, kept apart."""
    command = timeline.commands[-1] if timeline.commands else None
    open_stops = [i for i in timeline.interruptions if i.resolved_at is None]
    if open_stops:
        stop = open_stops[-1]
        recovery = Dimension(
            "Recovery",
            f"Stopped: {stop.get_kind_display().lower()}",
            "alarm",
            [Fact("Since", stop.created_at.strftime("%Y-%m-%d %H:%M:%S UTC"))],
            [str(c) for c in stop.challenges],
        )
    elif timeline.interruptions:
        recovery = Dimension(
            "Recovery",
            "Recovered: every interruption resolved",
            "ok",
            [Fact("Interruptions", str(len(timeline.interruptions))), Fact("Still open", "none")],
        )
    else:
        recovery = Dimension(
            "Recovery", "No interruption: the remote never refused the credential", "ok"
        )

    approval: Approval | None = timeline.approvals[-1] if timeline.approvals else None
    facts: list[Fact] = []
    if approval is not None:
        facts.append(Fact("Approval", approval_state(approval, now)))
        if approval.fingerprint:
            facts.append(_id_fact("Fingerprint", approval.fingerprint, "fingerprint"))
        if approval.consumed_by_execution:
            facts.append(_id_fact("Consumed by", approval.consumed_by_execution, "consumed-by"))
    epoch: Epoch | None = timeline.epochs[-1] if timeline.epochs else None
    if epoch is not None:
        facts.append(Fact("Epoch", str(epoch.number)))
        facts.append(_id_fact("Execution", epoch.execution_id, "execution"))
        facts.append(Fact("Justification", epoch.get_justification_display()))
    if timeline.credential_refreshed_at is not None:
        facts.append(
            Fact("Credential", timeline.credential_refreshed_at.strftime("replaced %Y-%m-%d %H:%M"))
        )
    if open_stops:
        authority = Dimension(
            "Authority", "Waiting: the credential must be replaced", "wait", facts
        )
    elif epoch is not None:
        authority = Dimension("Authority", f"Epoch {epoch.number} may act", "ok", facts)
    elif approval is not None:
        authority = Dimension(
            "Authority", f"Approval {approval_state(approval, now)}", "wait", facts
        )
    else:
        authority = Dimension("Authority", "No approval", "wait", facts)

    if command is None:
        effect = Dimension("Effect", "No command", "wait")
    else:
        finding = _latest_finding(timeline.decisions)
        status = command.get_state_display()
        if command.state == Command.State.RECONCILED and finding:
            status += f" as {finding.replace('_', ' ')}"
        tone = {
            Command.State.OUTCOME_UNKNOWN: "alarm",
            Command.State.SENDING: "wait",
            Command.State.PENDING: "wait",
            Command.State.REJECTED: "wait",
        }.get(Command.State(command.state), "ok")
        receipts = [i.receipt for i in timeline.invocations if i.receipt]
        effect_facts = [
            _id_fact("Command", str(command.pk), "command"),
            Fact("Idempotency key", command.idempotency_key, "", "fact-key"),
            Fact("Adapter calls", str(sum(1 for i in timeline.invocations if i.kind == "execute"))),
        ]
        if receipts:
            effect_facts.append(Fact("Receipt", receipts[-1], "", "fact-receipt"))
        effect = Dimension("Effect", status, tone, effect_facts)
    return [recovery, authority, effect]


# Effects nothing more will happen to unless an operator compensates: the timeline says
# where they stand, not why nothing runs.
_SETTLED = (Command.State.COMMITTED, Command.State.COMPENSATED, Command.State.RECONCILED)


def why_title(timeline: Timeline) -> str:
    command = timeline.commands[-1] if timeline.commands else None
    open_stop = any(i.resolved_at is None for i in timeline.interruptions)
    if command is not None and command.state in _SETTLED and not open_stop:
        return "Where it stands"
    return "Why nothing runs"


def why_nothing_runs(timeline: Timeline) -> str:
    """One sentence that says what the occurrence waits for, if anything."""
    command = timeline.commands[-1] if timeline.commands else None
    queryable = adapters.can_query(timeline.occurrence.tool.adapter)
    if command is None:
        return "No command yet: the approval has not been claimed."
    if any(i.resolved_at is None for i in timeline.interruptions):
        return (
            "It waits for authority: the remote asked for authentication. Replace the "
            "credential (an admin), or decide here."
        )
    return {
        Command.State.OUTCOME_UNKNOWN: (
            "It waits for reconciliation: the effect is unknown, and no automatic attempt is "
            "justified. "
            + ("Query the effect, reconcile" if queryable else "Reconcile")
            + " it by hand with evidence, or accept the ambiguity."
        ),
        Command.State.SENDING: "A call may be in flight; if it is stuck, query the effect.",
        Command.State.PENDING: (
            "It waits for the runtime: the agent's runtime executes this command itself and "
            "has not reported an effect yet (a new attempt is told to it by its callback and "
            "its occurrence answer)."
            if command.executed_by == Command.ExecutedBy.RUNTIME
            else "The command waits for delivery to the adapter."
        ),
        Command.State.REJECTED: "The remote refused it before executing it; a retry is justified.",
        Command.State.RECONCILED: "An operator reconciled the effect by hand; it is settled.",
        Command.State.COMPENSATED: "The effect was undone (compensated); it is settled.",
    }.get(Command.State(command.state), "The effect is committed: settled, nothing needs to run.")


_ACTIONS = [
    (
        "query-effect",
        "query_effect",
        "Query effect",
        "Ask the adapter whether the effect exists.",
        [],
    ),
    (
        "reconcile",
        "reconcile",
        "Reconcile",
        "Record, with evidence, whether the effect happened.",
        ["outcome", "evidence"],
    ),
    (
        "accept-ambiguity",
        "accept_ambiguity",
        "Accept ambiguity",
        "A duplicate is possible and accepted: admit a new epoch and deliver again.",
        [],
    ),
    (
        "retry",
        "retry",
        "Retry",
        "Admit a new epoch where the evidence justifies it (not sent, rejected, reconciled "
        "as not committed).",
        [],
    ),
    (
        "compensate",
        "compensate",
        "Compensate",
        "Undo the effect through the adapter, or record a compensation done elsewhere.",
        ["manual_evidence"],
    ),
]

ACTION_SLUGS = {slug: action for slug, action, *_ in _ACTIONS}


def action_forms(
    command: Command | None, adapter: str, decisions: list[OperatorDecision]
) -> ActionForms:
    if command is None:
        return ActionForms([], [])
    finding = _latest_finding([d for d in decisions if d.command_id == command.pk])
    open_now = allowed_actions(state=command.state, finding=finding, adapter=adapter)
    offered, withheld = [], []
    for slug, action, label, help_text, extra in _ACTIONS:
        if action in open_now:
            offered.append(ActionForm(slug, label, help_text, extra))
        else:
            why = why_not(action, state=command.state, finding=finding, adapter=adapter)
            withheld.append((label, why))
    return ActionForms(offered, withheld)


@dataclass(frozen=True)
class TimelineRow:
    """One entry of the timeline, as ``{% timeline_entry %}`` renders it."""

    at: datetime
    kind: str
    actor: str  # agent-supplied for events: shown revealed
    id: str  # the producer's event id, or which invocation
    summary: str
    details: list[tuple[str, str]]  # values agent-supplied: shown revealed
    flag: str  # "", "security" or "decision"


def timeline_caption(timeline: Timeline) -> str:
    """Which events the timeline shows out of how many, worded as the review page's
    history is, and how many adapter invocations it merged in."""
    caption = history_caption(timeline.history)
    calls = sum(1 for entry in timeline.entries if entry.invocation is not None)
    if not calls:
        return caption
    return f"{caption}, with {calls} adapter invocation{'' if calls == 1 else 's'}"


def timeline_links(timeline: Timeline) -> list[HistoryLink]:
    """The timeline's pager: the review page's, leading to this page's windows."""
    occurrence_id = timeline.occurrence.pk
    page = f"{reverse('reconciliation:timeline', args=[occurrence_id])}#timeline"
    return history_links(occurrence_id, timeline.history, page=page)


def timeline_rows(timeline: Timeline) -> list[TimelineRow]:
    rows = []
    for entry in timeline.entries:
        if entry.invocation is not None:
            inv = entry.invocation
            rows.append(
                TimelineRow(
                    at=entry.at,
                    kind=f"invocation.{inv.kind}",
                    actor="worker",
                    id=f"invocation {inv.number} (epoch {inv.epoch.number})",
                    summary=f"{inv.justification} → {inv.outcome or 'in flight'}",
                    details=[
                        (k, v)
                        for k, v in (
                            (
                                "finished",
                                inv.finished_at.strftime("%H:%M:%S") if inv.finished_at else "",
                            ),
                            ("receipt", inv.receipt),
                            ("detail", inv.detail),
                            ("message", inv.message_id),
                        )
                        if v
                    ],
                    flag="",
                )
            )
            continue
        event = entry.event
        assert event is not None
        data = event.data if isinstance(event.data, dict) else {}
        details = [(k, _text(v)) for k, v in data.items() if v not in ("", None, [], {})]
        if event.execution_id:
            details.append(("execution", event.execution_id))
        if event.token_fingerprint:
            details.append(("fingerprint", event.token_fingerprint))
        if event.message_id:
            details.append(("message", event.message_id))
        flag = ""
        # The review page's security events: a refused use of an approval, a refused report.
        if (
            is_refused_use(event.kind, event.decision)
            or event.kind == AuditKind.EFFECT_REPORT_REFUSED
        ):
            flag = "security"
        elif event.kind.startswith(OPERATOR_PREFIX):
            flag = "decision"
        rows.append(
            TimelineRow(
                at=entry.at,
                kind=event.kind,
                actor=event.actor,
                id=str(event.event_id),
                summary=" · ".join(x for x in (event.decision, event.reason_code) if x),
                details=details,
                flag=flag,
            )
        )
    return rows


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "; ".join(_text(v) for v in value)
    return str(value)


REASON_CHOICES = [("", "All reasons")] + [(r.value, r.label) for r in QUEUE_REASONS]
