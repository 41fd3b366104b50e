"""The investigation page's rows: the chain of events (a window of it, repeated cells
shared), the commands, the approvals and the duplicate deliveries."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar
from urllib.parse import urlencode

from django.urls import reverse
from django.utils.safestring import SafeString

from approvals import vocabulary
from approvals.models import (
    Command,
    Occurrence,
    Proposal,
)
from approvals.web.jinja import render_rows
from approvals.web.links import occurrence_path
from approvals.web.money import MoneyLine, money_lines
from approvals.web.text import plain_reveal, reveal_html
from reconciliation.investigations.facts import (
    APPROVED,
    DUPLICATE_DELIVERY,
    REDELIVERED_KIND,
    ApprovalFact,
    EventFact,
)
from reconciliation.investigations.gather import Investigation
from reconciliation.investigations.verdict import assess
from reconciliation.investigations.wording import TITLE_VALUES, listing, when
from reconciliation.models import AdapterInvocation


@dataclass(frozen=True)
class ChainRow:
    at: datetime
    kind: str
    outcome: str
    fingerprint: str
    execution: SafeString
    message: SafeString
    command_id: str
    event_id: str  # the producer's; "" for an adapter invocation (a row, not an event)
    origin: str
    deliveries: int  # times the event reached the audit trail
    flag: str  # security, redelivery, approved, duplicate, effect or ""
    tenant: str = ""
    gap: ClassVar[bool] = False  # a step shown, not a run of steps left out


@dataclass(frozen=True)
class CommandRow:
    command: Command
    occurrence_url: str
    execution: SafeString
    invocations: int
    by_kind: str
    receipts: list[str]
    messages: list[str]


@dataclass(frozen=True)
class ApprovalRow:
    fact: ApprovalFact
    occurrence: Occurrence | None
    occurrence_url: str
    consumed_by: SafeString


@dataclass(frozen=True)
class DeliveryRow:
    event_id: str
    kind: str
    execution: SafeString
    first: str  # where and when the stored copy came from
    again: str  # the later delivery: batch, time, line
    same_payload: bool


@dataclass(frozen=True)
class OccurrenceLink:
    occurrence: Occurrence
    url: str
    money: list[MoneyLine]


@dataclass(frozen=True)
class Count:
    one: str
    many: str
    value: int
    values: list[str]  # what was counted, for the title

    @property
    def label(self) -> str:
        return self.one if self.value == 1 else self.many

    @property
    def title(self) -> str:
        """The first values counted, and how many more (a chain of thousands of replays
        counts as many executions: a tooltip cannot list them, the chain below does)."""
        return plain_reveal(listing(self.values, TITLE_VALUES, separator=", "))


def occurrence_url(occurrence_id: Any, tenant_id: int, operator_tenant_ids: Iterable[int]) -> str:
    """The operators' timeline for operators; the review page for admins."""
    if tenant_id in set(operator_tenant_ids):
        return occurrence_path("reconciliation:timeline", occurrence_id)
    return occurrence_path("approvals:review", occurrence_id)


def _event_outcome(event: EventFact) -> str:
    parts = [p for p in (event.decision, event.reason_code) if p]
    text = " · ".join(dict.fromkeys(parts))
    if event.receipt:
        text += f" · receipt {event.receipt}"
    return text


def _event_flag(event: EventFact, deliveries: int) -> str:
    if deliveries > 1:
        return "duplicate"
    if vocabulary.is_refused_use(event.kind, event.decision):
        return "security"
    if event.decision == DUPLICATE_DELIVERY or event.kind == REDELIVERED_KIND:
        return "redelivery"
    if event.decision == APPROVED:
        return "approved"
    if event.kind.startswith(vocabulary.EFFECT_PREFIX):
        return "effect"
    return ""


# The newest steps a long chain shows; the steps before them are summarized, except those
# the verdict rests on (flags below, and every adapter call), which are always shown.
CHAIN_WINDOW = 100


_ALWAYS_SHOWN_FLAGS = ("approved", "effect", "duplicate")


@dataclass(frozen=True)
class ChainGap:
    """Consecutive steps of the chain that are not shown: how many, of which kinds."""

    hidden: int
    kinds: str  # "380 claim.replayed, 5 claim.duplicate_delivery"
    gap: ClassVar[bool] = True


@dataclass(frozen=True)
class Chain:
    rows: list[ChainRow | ChainGap]  # oldest first
    steps: int  # the steps read: events and adapter invocations
    shown: int

    @property
    def hidden(self) -> int:
        return self.steps - self.shown


def _kinds(counter: Counter[str], most: int = 3) -> str:
    ranked = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
    text = ", ".join(f"{n} {kind}" for kind, n in ranked[:most])
    rest = sum(n for _, n in ranked[most:])
    return text + (f", {rest} of other kinds" if rest else "")


def chain_rows(
    found: Investigation, tenant_names: dict[int, str], *, every_step: bool = False
) -> Chain:
    """The chain's steps, oldest first. A chain longer than ``CHAIN_WINDOW`` steps shows its
    newest ``CHAIN_WINDOW`` and, before them, only what the verdict rests on (approved
    claims, effects, events delivered more than once, adapter calls); each run of steps left
    out becomes one ``ChainGap``. ``every_step`` shows them all."""
    later: Counter[int] = Counter()
    for delivery in found.facts.deliveries:
        later[delivery.original_pk] += delivery.copies
    # (time, tie-break, the step, its deliveries, its flag): rows are built for shown ones.
    steps: list[tuple[datetime, int, EventFact | AdapterInvocation, int, str]] = []
    for event in found.facts.events:
        deliveries = 1 + later.get(event.pk, 0)
        steps.append(
            (event.source_time, event.pk, event, deliveries, _event_flag(event, deliveries))
        )
    for invocation in found.invocations:
        flag = "effect" if invocation.receipt else ""
        steps.append((invocation.started_at, 0, invocation, 1, flag))
    steps.sort(key=lambda step: (step[0], step[1]))

    window_start = 0 if every_step else max(0, len(steps) - CHAIN_WINDOW)
    tenant_of_command = {c.pk: c.tenant_id for c in found.commands}
    rows: list[ChainRow | ChainGap] = []
    hidden: Counter[str] = Counter()
    shown = 0
    for n, (at, _, step, deliveries, flag) in enumerate(steps):
        is_invocation = isinstance(step, AdapterInvocation)
        if n < window_start and not is_invocation and flag not in _ALWAYS_SHOWN_FLAGS:
            hidden[step.kind] += 1
            continue
        if hidden:
            rows.append(ChainGap(hidden.total(), _kinds(hidden)))
            hidden = Counter()
        shown += 1
        if isinstance(step, AdapterInvocation):
            outcome = step.outcome or "unfinished"
            if step.receipt:
                outcome += f" · receipt {step.receipt}"
            rows.append(
                ChainRow(
                    at=at,
                    kind=f"invocation.{step.kind} #{step.number}",
                    outcome=f"{outcome} · {step.justification}",
                    fingerprint="",
                    execution=reveal_html(step.epoch.execution_id),
                    message=reveal_html(step.message_id),
                    command_id=str(step.command_id),
                    event_id="",
                    origin="adapter",
                    deliveries=1,
                    flag=flag,
                    tenant=tenant_names.get(tenant_of_command.get(step.command_id, 0), ""),
                )
            )
            continue
        rows.append(
            ChainRow(
                at=at,
                kind=step.kind,
                outcome=_event_outcome(step),
                fingerprint=step.fingerprint,
                execution=reveal_html(step.execution_id),
                message=reveal_html(step.message_id),
                command_id=step.command_id,
                event_id=step.event_id,
                origin="console" if step.ingestion_id is None else f"batch #{step.ingestion_id}",
                deliveries=deliveries,
                flag=flag,
                tenant=tenant_names.get(step.tenant_id, ""),
            )
        )
    return Chain(rows, len(steps), shown)


def delivery_rows(found: Investigation) -> list[DeliveryRow]:
    events = {e.pk: e for e in found.facts.events}
    rows = []
    for delivery in found.facts.deliveries:
        event = events[delivery.original_pk]
        first = (
            f"batch #{event.ingestion_id}, {when(event.ingested_at)}"
            if event.ingestion_id is not None
            else f"this console, {when(event.ingested_at)}"
        )
        rows.append(
            DeliveryRow(
                event_id=delivery.event_id,
                kind=event.kind,
                execution=reveal_html(event.execution_id),
                first=first,
                again=f"batch #{delivery.ingestion_id}, {when(delivery.received_at)}, "
                f"line {delivery.line}"
                + (f" and {delivery.copies - 1} more" if delivery.copies > 1 else ""),
                same_payload=delivery.same_payload,
            )
        )
    return rows


def _investigation_url(q: str, *, every_step: bool) -> str:
    query = {"q": q, "steps": "all"} if every_step else {"q": q}
    return f"{reverse('reconciliation:investigations')}?{urlencode(query)}#chain-h"


def investigation_page(
    found: Investigation,
    *,
    operator_tenant_ids: Iterable[int],
    show_tenant: bool,
    every_step: bool = False,
) -> dict[str, Any]:
    """What the template shows: the verdict first, then the chain and its parts."""
    operators = set(operator_tenant_ids)
    facts = found.facts
    assessment = assess(facts)
    occurrences = {o.pk: o for o in found.occurrences}
    tenant_names = {o.tenant_id: o.tenant.name for o in found.occurrences} if show_tenant else {}
    links = [
        OccurrenceLink(
            o,
            occurrence_url(o.pk, o.tenant_id, operators),
            money_lines(Proposal.arguments_of(o.current_action)) if o.current_action else [],  # type: ignore[attr-defined]
        )
        for o in found.occurrences
    ]
    url_of = {link.occurrence.pk: link.url for link in links}
    by_command: dict[uuid.UUID, list[AdapterInvocation]] = defaultdict(list)
    for invocation in found.invocations:
        by_command[invocation.command_id].append(invocation)
    command_rows = []
    for command in found.commands:
        calls = by_command.get(command.pk, [])
        kinds = Counter(i.kind for i in calls)
        command_rows.append(
            CommandRow(
                command=command,
                occurrence_url=url_of.get(command.occurrence_id)
                or occurrence_url(command.occurrence_id, command.tenant_id, operators),
                execution=reveal_html(command.execution_id),
                invocations=len(calls),
                by_kind=", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())),
                receipts=sorted({i.receipt for i in calls if i.receipt}),
                messages=sorted({i.message_id for i in calls if i.message_id}),
            )
        )
    approval_rows = []
    for approval in facts.approvals:
        occurrence_id = uuid.UUID(approval.occurrence_id)
        occurrence = occurrences.get(occurrence_id)
        approval_rows.append(
            ApprovalRow(
                approval,
                occurrence,
                url_of.get(occurrence_id)
                or occurrence_url(occurrence_id, approval.tenant_id, operators),
                reveal_html(approval.consumed_by_execution),
            )
        )
    executions = sorted(
        {e.execution_id for e in facts.events if e.execution_id}
        | {c.execution_id for c in facts.commands}
    )
    messages = sorted(
        {e.message_id for e in facts.events if e.message_id}
        | {i.message_id for i in facts.invocations if i.message_id}
    )
    fingerprints = sorted(
        {a.fingerprint for a in facts.approvals if a.fingerprint}
        | {e.fingerprint for e in facts.events if e.fingerprint}
    )
    commands = sorted(
        {c.pk for c in facts.commands} | {e.command_id for e in facts.events if e.command_id}
    )
    effects = Counter(c.state for c in facts.commands)
    counts = [
        Count("fingerprint", "fingerprints", len(fingerprints), fingerprints),
        Count("execution", "executions", len(executions), executions),
        Count("queue message id", "queue message ids", len(messages), messages),
        Count("command", "commands", len(commands), commands),
        Count("adapter invocation", "adapter invocations", len(facts.invocations), []),
        Count("audit event", "audit events", facts.events_total, []),
        Count("duplicate delivery", "duplicate deliveries", len(facts.deliveries), []),
    ]
    every_url = _investigation_url(found.query, every_step=True)
    return {
        "assessment": assessment,
        "occurrence_links": links,
        "approval_rows": approval_rows,
        "command_rows": command_rows,
        "chain": (chain := chain_rows(found, tenant_names, every_step=every_step)),
        "chain_html": render_rows(
            "reconciliation/chain_rows.html",
            {
                "rows": chain.rows,
                "show_tenant": show_tenant,
                "every_step_url": every_url,
                "investigate_url": reverse("reconciliation:investigations"),
            },
        ),
        "every_step": every_step,
        "every_step_url": every_url,
        "fewer_steps_url": _investigation_url(found.query, every_step=False),
        "chain_window": CHAIN_WINDOW,
        "deliveries": delivery_rows(found),
        "counts": counts,
        "effects": [
            (state, Command.State(state).label.lower(), n) for state, n in sorted(effects.items())
        ],
        "limited": found.limited,
        "show_tenant": show_tenant,
        "events_shown": len(facts.events),
        "events_total": facts.events_total,
    }
