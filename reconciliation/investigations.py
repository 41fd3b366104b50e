"""Investigations: from one id to the joined chain of evidence, and a verdict.

An investigator names a token fingerprint, an execution id, a command id or an occurrence
id. ``investigation_get`` finds what it names in the investigator's tenants and gathers the
chain around it (issuance, every claim decision with its producer event id, executions,
queue message ids, commands, adapter invocations, effects, and the audit events other
producers sent, with their duplicate deliveries) in a fixed number of queries, whatever
the number of rows. It turns them into plain ``Facts``.

``assess`` is a pure function of those facts. It names the stories the evidence supports,
worst first, each with the facts it rests on, and says what the evidence cannot tell:

* control failure: one fingerprint, approved decisions for two or more executions;
* idempotent execution failure: one command, two or more distinct receipts at the adapter;
* duplicated audit delivery: one producer event id delivered to the audit trail twice;
* healthy redelivery: one execution, a claim or a command delivered again, one command;
* control working: one approved execution, attempts by other executions refused.

``investigation_page`` shapes both for the template.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import urlencode

from django.contrib.auth import get_user_model
from django.db import connection, models
from django.db.models import (
    Case,
    CharField,
    F,
    Field,
    Func,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    UUIDField,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from approvals import vocabulary
from approvals.access import tokens
from approvals.compiled import (
    Compiled,
    CompiledStatement,
    Literal,
    Param,
    ParamArray,
    ParamList,
)
from approvals.models import (
    Approval,
    AuditDuplicateDelivery,
    AuditEvent,
    Command,
    Membership,
    Occurrence,
    Proposal,
    Tenant,
)
from approvals.reviews.selectors import effective_approval_state, parse_uuid, snapshot
from approvals.vocabulary import AuditKind, ClaimDecision
from approvals.web.links import occurrence_path
from approvals.web.money import MoneyLine, money_lines
from approvals.web.text import reveal_html
from reconciliation.models import AdapterInvocation, OperatorDecision

User = get_user_model()

# --- who may investigate ------------------------------------------------------------------


@dataclass(frozen=True)
class InvestigatorAccess:
    """The tenants where a user is an operator or an admin (and, for the header's Access
    tokens link, a reviewer), read in one query."""

    operator_tenant_ids: frozenset[int]
    admin_tenant_ids: frozenset[int]
    reviewer_tenant_ids: frozenset[int] = frozenset()

    @property
    def tenant_ids(self) -> list[int]:
        return sorted(self.operator_tenant_ids | self.admin_tenant_ids)


def investigator_access(user: Any) -> InvestigatorAccess:
    if not user.is_authenticated:
        return InvestigatorAccess(frozenset(), frozenset())
    rows = Membership.objects.filter(user_id=user.pk).values_list("tenant_id", "role")
    by_role: dict[str, set[int]] = {role: set() for role in Membership.Role.values}
    for tenant_id, role in rows:
        by_role[role].add(tenant_id)
    return InvestigatorAccess(
        frozenset(by_role[Membership.Role.OPERATOR]),
        frozenset(by_role[Membership.Role.ADMIN]),
        frozenset(by_role[Membership.Role.REVIEWER]),
    )


# --- what was asked -------------------------------------------------------------------------

QUERY_MAX_CHARS = 200  # the longest execution id
_RAW_TOKEN = re.compile(re.escape(tokens.APPROVAL_TOKEN_PREFIX) + r"[A-Za-z0-9_-]{16,}")


@dataclass(frozen=True)
class QueryRead:
    """The search box's text as the investigation uses it. A raw approval token is never
    searched for nor shown: its fingerprint is (``fingerprint_of_token``); a runtime key
    is refused."""

    q: str
    refusal: str = ""
    fingerprint_of_token: str = ""


def query_read(raw: str) -> QueryRead:
    text = (raw or "").strip()
    token = _RAW_TOKEN.search(text)
    if token:
        return QueryRead("", fingerprint_of_token=tokens.fingerprint(token.group(0)))
    if text.startswith(tokens.RUNTIME_KEY_PREFIX) and len(text) > 20:
        return QueryRead(
            "",
            refusal="That looks like a runtime key. It was not searched for and is not shown; "
            "treat it as exposed and deactivate it if it is real.",
        )
    if len(text) > QUERY_MAX_CHARS:
        return QueryRead("", refusal=f"Search for one id of at most {QUERY_MAX_CHARS} characters.")
    return QueryRead(text)


# --- the facts (plain values: what ``assess`` reads) -------------------------------------

APPROVED = ClaimDecision.APPROVED
DUPLICATE_DELIVERY = ClaimDecision.DUPLICATE_DELIVERY
REPLAYED = ClaimDecision.REPLAYED
REFUSALS = vocabulary.REFUSING
# Kinds other producers use for a claim decision (the background article's among them).
_CLAIM_KINDS = ("approval_decision", "approval_claimed")
REDELIVERED_KIND = AuditKind.DISPATCH_REDELIVERED
COMMITTED_KIND = AuditKind.EFFECT_COMMITTED
# Invocation kinds whose receipt names an effect under the command's key (a compensation's
# receipt names the reversal, another thing).
_EFFECT_INVOCATION_KINDS = (AdapterInvocation.Kind.EXECUTE, AdapterInvocation.Kind.QUERY)
# A later delivery that found the command sending and called again, by the contract.
_RESUMING_JUSTIFICATIONS = ("effect_queryable", "idempotent_with_key", "read_only")
_UNSETTLED_STATES = (Command.State.OUTCOME_UNKNOWN, Command.State.SENDING)


class EventFact(NamedTuple):
    """One audit event as the verdict reads it. A named tuple, not a frozen dataclass: an
    investigation builds hundreds per request, and a tuple is built eight times faster."""

    pk: int
    event_id: str  # the producer's
    kind: str
    tenant_id: int
    source_time: datetime
    fingerprint: str = ""
    decision: str = ""
    reason_code: str = ""
    execution_id: str = ""
    message_id: str = ""
    command_id: str = ""
    occurrence_id: str = ""
    receipt: str = ""  # an effect event's receipt, if it names one
    ingestion_id: int | None = None  # None: written by this console
    ingested_at: datetime | None = None

    @property
    def is_claim(self) -> bool:
        return self.kind.startswith("claim") or self.kind in _CLAIM_KINDS

    @property
    def is_approved_claim(self) -> bool:
        return self.is_claim and self.decision == APPROVED

    @property
    def origin(self) -> str:
        if self.ingestion_id is None:
            return "written by this console"
        return f"ingested in batch #{self.ingestion_id}"


@dataclass(frozen=True)
class ApprovalFact:
    tenant_id: int
    occurrence_id: str
    fingerprint: str  # "" until the token was picked up
    state: str  # as it stands now (an issued approval past its expiry is expired)
    consumed_by_execution: str = ""
    command_id: str = ""
    approver: str = ""
    issued_at: datetime | None = None
    expires_at: datetime | None = None
    delivered_at: datetime | None = None


@dataclass(frozen=True)
class CommandFact:
    pk: str
    tenant_id: int
    occurrence_id: str
    execution_id: str
    state: str
    idempotency_key: str = ""
    fingerprint: str = ""


@dataclass(frozen=True)
class InvocationFact:
    command_id: str
    number: int
    kind: str
    outcome: str = ""
    receipt: str = ""
    justification: str = ""
    message_id: str = ""
    execution_id: str = ""  # its epoch's
    started_at: datetime | None = None


@dataclass(frozen=True)
class DecisionFact:
    command_id: str
    action: str
    operator: str
    finding: str = ""
    created_at: datetime | None = None


@dataclass(frozen=True)
class DeliveryFact:
    """A later delivery of a stored producer event (``AuditDuplicateDelivery``)."""

    original_pk: int
    event_id: str
    ingestion_id: int
    received_at: datetime
    line: int
    same_payload: bool


@dataclass(frozen=True)
class Facts:
    approvals: tuple[ApprovalFact, ...] = ()
    commands: tuple[CommandFact, ...] = ()
    invocations: tuple[InvocationFact, ...] = ()
    decisions: tuple[DecisionFact, ...] = ()
    events: tuple[EventFact, ...] = ()
    deliveries: tuple[DeliveryFact, ...] = ()
    # Events in the chain; ``events`` may hold fewer (the newest, and every decisive one).
    events_total: int = 0
    # How many of ``events`` are the chain's newest (the rest are decisive ones before them).
    events_newest: int = 0

    @property
    def empty(self) -> bool:
        return not (self.approvals or self.commands or self.events)


# --- the verdict (a pure function of the facts) -------------------------------------------

CONTROL_FAILURE = "control_failure"
IDEMPOTENT_EXECUTION_FAILURE = "idempotent_execution_failure"
DUPLICATED_AUDIT_DELIVERY = "duplicated_audit_delivery"
HEALTHY_REDELIVERY = "healthy_redelivery"
CONTROL_WORKING = "control_working"


@dataclass(frozen=True)
class Story:
    label: str
    tone: str  # alarm, warn, ok
    meaning: str


# Worst first: the order verdicts are listed in.
STORIES: dict[str, Story] = {
    CONTROL_FAILURE: Story(
        "Control failure",
        "alarm",
        "One approval authorized more than one execution: the single-use claim did not hold.",
    ),
    IDEMPOTENT_EXECUTION_FAILURE: Story(
        "Idempotent execution failure",
        "alarm",
        "Authorization held, but one command had more than one effect at the adapter: its "
        "idempotency key did not stop a second effect.",
    ),
    DUPLICATED_AUDIT_DELIVERY: Story(
        "Duplicated audit delivery",
        "warn",
        "One producer event reached the audit trail more than once. It records one decision: "
        "counting rows would overstate what happened.",
    ),
    HEALTHY_REDELIVERY: Story(
        "Healthy redelivery",
        "ok",
        "A claim or a command was delivered again and resolved to the existing command: one "
        "execution, one command, no second effect.",
    ),
    CONTROL_WORKING: Story(
        "Control working",
        "ok",
        "The approval authorized one execution; other executions that presented it were "
        "refused as replays.",
    ),
}


@dataclass(frozen=True)
class Verdict:
    code: str
    facts: tuple[str, ...]

    @property
    def story(self) -> Story:
        return STORIES[self.code]

    @property
    def label(self) -> str:
        return self.story.label

    @property
    def tone(self) -> str:
        return self.story.tone


@dataclass(frozen=True)
class Assessment:
    verdicts: tuple[Verdict, ...]  # worst first
    gaps: tuple[str, ...]  # what the evidence cannot tell
    summary: str

    @property
    def codes(self) -> list[str]:
        return [v.code for v in self.verdicts]

    @property
    def insufficient(self) -> bool:
        return not self.verdicts and bool(self.gaps)

    @property
    def tone(self) -> str:
        if self.verdicts:
            return self.verdicts[0].tone
        return "wait" if self.gaps else "ok"


def short(value: str) -> str:
    """A UUID's first 8 characters, for sentences; tables show it whole."""
    return value[:8] if len(value) == 36 else value


def _times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


def _plural(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


LISTED = 5  # the items a verdict's fact names before "and N more"
TITLE_VALUES = 20  # the values a count's tooltip names


def _listing(
    items: list[str], most: int = LISTED, *, total: int | None = None, separator: str = "; "
) -> str:
    """The first ``most`` items, and how many more of ``total`` (``len(items)``) there are:
    a caller with hundreds of items may pass only the first ``most``, formatted."""
    shown = items[:most]
    rest = (len(items) if total is None else total) - len(shown)
    return separator.join(shown) + (f"{separator}and {rest} more" if rest else "")


def _at(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "an unknown time"


FpKey = tuple[int, str]


@dataclass
class _Index:
    """The facts looked up the ways the rules need them."""

    facts: Facts
    claims: list[EventFact] = field(default_factory=list)  # the claim events, in order
    commands: dict[str, CommandFact] = field(default_factory=dict)
    invocations: dict[str, list[InvocationFact]] = field(default_factory=lambda: defaultdict(list))
    decisions: dict[str, list[DecisionFact]] = field(default_factory=lambda: defaultdict(list))
    # fingerprint -> execution -> what says it was approved for it
    approved: dict[FpKey, dict[str, list[str]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    approved_commands: dict[FpKey, set[str]] = field(default_factory=lambda: defaultdict(set))
    console_approved: dict[FpKey, set[str]] = field(default_factory=lambda: defaultdict(set))
    unnamed_approved: Counter[FpKey] = field(default_factory=Counter)
    no_fingerprint_approved: int = 0
    # command -> receipt -> where it was seen
    receipts: dict[str, dict[str, list[str]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )

    def command_fingerprint(self, command_id: str) -> FpKey | None:
        command = self.commands.get(command_id)
        if command is not None and command.fingerprint:
            return (command.tenant_id, command.fingerprint)
        for key, commands in self.approved_commands.items():
            if command_id in commands:
                return key
        return None


def _index(facts: Facts) -> _Index:
    index = _Index(facts)
    index.commands = {c.pk: c for c in facts.commands}
    for invocation in sorted(facts.invocations, key=lambda i: (i.command_id, i.number)):
        index.invocations[invocation.command_id].append(invocation)
        if invocation.kind in _EFFECT_INVOCATION_KINDS and invocation.receipt:
            outcome = invocation.outcome or "unfinished"
            index.receipts[invocation.command_id][invocation.receipt].append(
                f"invocation {invocation.number}, {invocation.kind}, {outcome}"
            )
    for decision in facts.decisions:
        index.decisions[decision.command_id].append(decision)
    index.claims = [e for e in facts.events if e.is_claim]
    for event in facts.events:
        if event.is_approved_claim:
            if not event.fingerprint:
                index.no_fingerprint_approved += 1
                continue
            key = (event.tenant_id, event.fingerprint)
            if not event.execution_id:
                index.unnamed_approved[key] += 1
                continue
            command = f", command {short(event.command_id)}" if event.command_id else ""
            index.approved[key][event.execution_id].append(
                f"{event.kind} (producer event {short(event.event_id)}, {event.origin}{command})"
            )
            if event.command_id:
                index.approved_commands[key].add(event.command_id)
        if event.kind == COMMITTED_KIND and event.receipt and event.command_id:
            index.receipts[event.command_id][event.receipt].append(
                f"{event.kind} event {short(event.event_id)}"
            )
    for approval in facts.approvals:
        if approval.fingerprint and approval.consumed_by_execution:
            key = (approval.tenant_id, approval.fingerprint)
            command = f", command {short(approval.command_id)}" if approval.command_id else ""
            index.approved[key][approval.consumed_by_execution].append(
                f"the approval row is consumed by it{command}"
            )
            index.console_approved[key].add(approval.consumed_by_execution)
            if approval.command_id:
                index.approved_commands[key].add(approval.command_id)
    return index


def _control_failure(index: _Index) -> list[str]:
    facts: list[str] = []
    for key, executions in sorted(index.approved.items()):
        if len(executions) < 2:
            continue
        fingerprint = key[1]
        facts.append(
            f"Fingerprint {fingerprint} has approved decisions for "
            f"{_plural(len(executions), 'execution')}: {', '.join(sorted(executions))}."
        )
        for execution, sources in sorted(executions.items()):
            facts.append(f"{execution}: {_listing(sources)}.")
        commands = sorted(index.approved_commands.get(key, set()))
        if len(commands) > 1:
            facts.append(
                f"{_plural(len(commands), 'command')} came of it: "
                f"{', '.join(short(c) for c in commands)}."
            )
        console = index.console_approved.get(key, set())
        if console and set(executions) - console:
            others = ", ".join(sorted(set(executions) - console))
            facts.append(
                f"This console's own claim admitted only {', '.join(sorted(console))}; the "
                f"approval of {others} is recorded by another producer, so that claim ran "
                "outside this console's guard."
            )
    return facts


def _idempotent_failure(index: _Index) -> tuple[list[str], set[str]]:
    facts: list[str] = []
    failed: set[str] = set()
    for command_id, receipts in sorted(index.receipts.items()):
        if len(receipts) < 2:
            continue
        failed.add(command_id)
        command = index.commands.get(command_id)
        key = (
            f" (idempotency key {command.idempotency_key})"
            if command and command.idempotency_key
            else ""
        )
        seen = [f"{receipt} ({'; '.join(where)})" for receipt, where in receipts.items()]
        facts.append(
            f"Command {short(command_id)}{key}: {len(receipts)} distinct receipts under one "
            f"key: {_listing(seen)}."
        )
        calls = [i for i in index.invocations.get(command_id, []) if i.kind == "execute"]
        if calls:
            facts.append(f"The adapter was asked to execute it {_times(len(calls))}.")
        for call in calls:
            if call.outcome == AdapterInvocation.Outcome.ABANDONED and call.receipt:
                facts.append(
                    f"Invocation {call.number} was given up as abandoned, yet its answer "
                    f"arrived later with receipt {call.receipt}: that call reached the remote."
                )
        for decision in index.decisions.get(command_id, []):
            if decision.action == OperatorDecision.Action.ACCEPT_AMBIGUITY:
                facts.append(
                    f"{decision.operator} accepted the ambiguity at {_at(decision.created_at)}: "
                    "a duplicate was possible, and was accepted."
                )
    return facts, failed


def _duplicated_delivery(facts: Facts) -> list[str]:
    lines: list[str] = []
    later: dict[int, list[DeliveryFact]] = defaultdict(list)
    for delivery in facts.deliveries:
        later[delivery.original_pk].append(delivery)
    rows = Counter((e.tenant_id, e.event_id) for e in facts.events)
    described: set[tuple[int, str]] = set()
    for event in facts.events:
        key = (event.tenant_id, event.event_id)
        again = later.get(event.pk, [])
        if key in described or (not again and rows[key] < 2):
            continue
        described.add(key)
        what = ", ".join(x for x in (event.kind, event.decision, event.execution_id) if x)
        copies = rows[key] + len(again)
        first = (
            f"stored once from batch #{event.ingestion_id} at {_at(event.ingested_at)}"
            if event.ingestion_id is not None
            else f"written by this console at {_at(event.ingested_at or event.source_time)}"
        )
        repeats = [
            f"batch #{d.ingestion_id} at {_at(d.received_at)} (line {d.line}, "
            f"{'same content' if d.same_payload else 'different content'})"
            for d in again
        ]
        if rows[key] > 1:
            repeats.append(f"{rows[key]} stored rows carry this id")
        lines.append(
            f"Producer event {event.event_id} ({what}) was delivered {_times(copies)}: "
            f"{first}; again in {_listing(repeats)}."
        )
        if any(not d.same_payload for d in again):
            lines.append(
                f"A later delivery of {short(event.event_id)} says something else than the "
                "stored event: its producer reused an event id; ask that producer."
            )
    if lines:
        lines.append(
            "Each producer event is counted once here: the copies are one decision each, "
            "not several."
        )
    return lines


def _healthy_redelivery(index: _Index, excluded_fps: set[FpKey], failed: set[str]) -> list[str]:
    facts = index.facts
    command_ids = set(index.commands)
    for commands in index.approved_commands.values():
        command_ids |= commands
    lines: list[str] = []
    for command_id in sorted(command_ids):
        if command_id in failed:
            continue
        key = index.command_fingerprint(command_id)
        if key in excluded_fps:
            continue
        command = index.commands.get(command_id)
        executions = {
            e.execution_id
            for e in index.claims
            if e.decision == APPROVED and e.command_id == command_id and e.execution_id
        }
        if command is not None:
            executions.add(command.execution_id)
        if len(executions) != 1:
            continue
        [execution] = executions
        duplicates = [
            e
            for e in index.claims
            if e.decision == DUPLICATE_DELIVERY
            and (
                e.command_id == command_id
                or (
                    not e.command_id
                    and key is not None
                    and (e.tenant_id, e.fingerprint) == key
                    and e.execution_id == execution
                )
            )
        ]
        redelivered = [
            e for e in facts.events if e.kind == REDELIVERED_KIND and e.command_id == command_id
        ]
        invocations = index.invocations.get(command_id, [])
        resumed = [i for i in invocations if i.justification in _RESUMING_JUSTIFICATIONS]
        if not (duplicates or redelivered or resumed):
            continue
        if duplicates:
            lines.append(
                f"Execution {execution} claimed the token {_times(len(duplicates) + 1)}: "
                f"approved once, then duplicate_delivery {_times(len(duplicates))}, answered "
                f"with the same command {short(command_id)}."
            )
        if redelivered:
            states = sorted(
                {e.reason_code.removeprefix(vocabulary.ALREADY_PREFIX) for e in redelivered}
            )
            lines.append(
                f"The queue delivered command {short(command_id)} again "
                f"{_times(len(redelivered))} ({REDELIVERED_KIND}); its effect was already "
                f"{' or '.join(s for s in states if s) or 'settled'}, so nothing was called."
            )
        if resumed:
            reasons = ", ".join(sorted({i.justification for i in resumed}))
            lines.append(
                f"{_plural(len(resumed), 'later delivery', 'later deliveries')} found the "
                f"command sending and called under the contract's justification ({reasons}), "
                "with the same key."
            )
        claims = [e for e in index.claims if e.command_id == command_id]
        messages = sorted(
            {i.message_id for i in invocations if i.message_id}
            | {e.message_id for e in claims + redelivered + duplicates if e.message_id}
        )
        if len(messages) > 1:
            lines.append(f"Queue message ids: {', '.join(messages)}.")
        receipts = sorted(index.receipts.get(command_id, {}))
        state = f"effect {command.state}" if command else "effect not recorded by this console"
        receipt = f", receipt {receipts[0]}" if receipts else ""
        lines.append(
            f"One command ({short(command_id)}); the adapter was called "
            f"{_times(len(invocations)) if invocations else 'never'}; {state}{receipt}."
        )
    return lines


def _control_working(index: _Index, excluded_fps: set[FpKey]) -> list[str]:
    lines: list[str] = []
    for key, executions in sorted(index.approved.items()):
        if key in excluded_fps or len(executions) != 1 or index.unnamed_approved.get(key):
            continue
        [execution] = executions
        refused = [
            e
            for e in index.claims
            if (e.tenant_id, e.fingerprint) == key
            and e.decision in REFUSALS
            and e.execution_id != execution
        ]
        replays = [e for e in refused if e.decision == REPLAYED]
        if not replays:
            continue
        commands = sorted(index.approved_commands.get(key, set()))
        command = f" (command {short(commands[0])})" if len(commands) == 1 else ""
        lines.append(f"Fingerprint {key[1]} was approved once, for execution {execution}{command}.")
        attempts = [
            f"{e.execution_id or 'an unnamed execution'} at {_at(e.source_time)}"
            f" ({e.decision}{', ' + e.reason_code if e.reason_code else ''})"
            for e in replays[:LISTED]
        ]
        lines.append(
            f"{_plural(len(replays), 'attempt')} by other executions refused as replayed: "
            f"{_listing(attempts, total=len(replays))}."
        )
        others = [e for e in refused if e.decision != REPLAYED]
        if others:
            lines.append(
                f"Also refused: {_listing([f'{e.execution_id} ({e.decision})' for e in others])}."
            )
        if len(commands) <= 1:
            lines.append("No second command was created.")
    return lines


def _gaps(index: _Index, verdicts: list[Verdict]) -> list[str]:
    facts = index.facts
    gaps: list[str] = []
    if facts.events_total > len(facts.events):
        gaps.append(
            f"The chain has {facts.events_total} audit events; this reads the newest "
            f"{facts.events_newest or len(facts.events)} and every approved decision and "
            "committed effect, so older refusals and redeliveries may be missing from the counts."
        )
    for (_, fingerprint), n in sorted(index.unnamed_approved.items()):
        gaps.append(
            f"{_plural(n, 'approved decision')} for fingerprint {fingerprint} name no "
            "execution: one execution cannot be told from several."
        )
    if index.no_fingerprint_approved:
        gaps.append(
            f"{_plural(index.no_fingerprint_approved, 'approved decision')} carry no token "
            "fingerprint, so they cannot be tied to an approval."
        )
    for command in facts.commands:
        if command.state in _UNSETTLED_STATES:
            gaps.append(
                f"The effect of command {short(command.pk)} is {command.state.replace('_', ' ')}: "
                "whether the adapter acted, once or more, is not known. Query the effect or "
                "reconcile it."
            )
    for command_id, decisions in sorted(index.decisions.items()):
        accepted = [d for d in decisions if d.action == OperatorDecision.Action.ACCEPT_AMBIGUITY]
        calls = [i for i in index.invocations.get(command_id, []) if i.kind == "execute"]
        if accepted and len(calls) > 1 and len(index.receipts.get(command_id, {})) < 2:
            blind = [i for i in calls if not i.receipt]
            if blind:
                gaps.append(
                    f"{accepted[-1].operator} accepted the ambiguity on command "
                    f"{short(command_id)} and it was executed again; invocation "
                    f"{blind[0].number} ended {blind[0].outcome or 'unfinished'} without a "
                    "receipt, so a second effect can be neither proven nor ruled out from "
                    "these records. The remote's own records can tell."
                )
    committed: dict[str, set[str]] = defaultdict(set)
    for event in facts.events:
        if event.kind == COMMITTED_KIND and event.command_id and not event.receipt:
            committed[event.command_id].add(event.event_id)
    for command_id, ids in sorted(committed.items()):
        if len(ids) > 1:
            gaps.append(
                f"{len(ids)} {COMMITTED_KIND} events for command {short(command_id)} carry no "
                "receipt: one effect reported twice cannot be told from two effects."
            )
    claimed = {(e.tenant_id, e.fingerprint) for e in index.claims}
    for approval in facts.approvals:
        key = (approval.tenant_id, approval.fingerprint)
        if approval.consumed_by_execution or (approval.fingerprint and key in claimed):
            continue
        if approval.fingerprint:
            gaps.append(
                f"No claim of fingerprint {approval.fingerprint} is recorded: the approval is "
                f"{approval.state}, so there is nothing to judge yet."
            )
        else:
            gaps.append(
                f"The approval of occurrence {short(approval.occurrence_id)} is "
                f"{approval.state} and its token was never picked up: it has no fingerprint "
                "and no claim yet."
            )
    if not verdicts and not gaps and not index.approved:
        refused = Counter(e.decision or "no decision" for e in index.claims)
        if refused:
            tally = ", ".join(f"{n} {decision}" for decision, n in sorted(refused.items()))
            gaps.append(
                f"No claim here was approved ({tally}): no execution was authorized, so "
                "there is no replay or redelivery to judge."
            )
        else:
            gaps.append("No claim decision is recorded here, so there is nothing to judge.")
    return gaps


def assess(facts: Facts) -> Assessment:
    """The verdicts the facts support, worst first, with what each rests on, and what the
    facts cannot tell. Pure: no database, no clock."""
    index = _index(facts)
    verdicts: list[Verdict] = []

    failure = _control_failure(index)
    failed_fps = {key for key, executions in index.approved.items() if len(executions) > 1}
    if failure:
        verdicts.append(Verdict(CONTROL_FAILURE, tuple(failure)))
    duplicated_effects, failed_commands = _idempotent_failure(index)
    if duplicated_effects:
        verdicts.append(Verdict(IDEMPOTENT_EXECUTION_FAILURE, tuple(duplicated_effects)))
    delivered_twice = _duplicated_delivery(facts)
    if delivered_twice:
        verdicts.append(Verdict(DUPLICATED_AUDIT_DELIVERY, tuple(delivered_twice)))
    healthy = _healthy_redelivery(index, failed_fps, failed_commands)
    if healthy:
        verdicts.append(Verdict(HEALTHY_REDELIVERY, tuple(healthy)))
    working = _control_working(index, failed_fps)
    if working:
        verdicts.append(Verdict(CONTROL_WORKING, tuple(working)))

    gaps = _gaps(index, verdicts)
    if verdicts:
        summary = verdicts[0].story.meaning
        if len(verdicts) > 1:
            summary += " Also: " + ", ".join(v.label.lower() for v in verdicts[1:]) + "."
    elif gaps:
        summary = "The evidence is insufficient for a verdict: see what it cannot tell, below."
    else:
        summary = (
            "None of the five stories: one approved execution, one command, and nothing "
            "replayed, delivered twice or executed twice."
        )
    return Assessment(tuple(verdicts), tuple(gaps), summary)


# --- gathering the facts (a fixed number of queries) --------------------------------------

# Bounds that keep one page's work bounded when an id names very many things.
SEED_LIMIT = 200
OCCURRENCE_LIMIT = 50
EVENT_LIMIT = 500
DECISIVE_LIMIT = 200


@dataclass(frozen=True)
class Investigation:
    query: str
    facts: Facts
    occurrences: list[Occurrence]
    invocations: list[AdapterInvocation]
    commands: list[Command]
    limited: bool  # the id named more occurrences than one page gathers

    @property
    def found(self) -> bool:
        return not self.facts.empty or bool(self.occurrences)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def investigation_get(
    *, q: str, tenant_ids: list[int], now: datetime | None = None
) -> Investigation:
    """What ``q`` names in ``tenant_ids`` and the chain around it.

    ``q`` is matched exactly against token fingerprints and execution ids (of audit events
    and approvals) and, when it is a UUID, occurrence and command ids (of the console's
    rows, and of events other producers sent). What matches gives the occurrences,
    fingerprints and commands whose records are then read together, as of one moment: a
    claim committing meanwhile is in all of them or in none."""
    with snapshot():
        return _investigation_get(q=q, tenant_ids=tenant_ids, now=now)


def _investigation_get(*, q: str, tenant_ids: list[int], now: datetime | None) -> Investigation:
    now = now or timezone.now()
    pk = parse_uuid(q) if q else None
    empty = Investigation(q, Facts(), [], [], [], False)
    if not q or not tenant_ids:
        return empty

    # 1. What the id names: the audit trail (indexed by tenant and fingerprint, tenant and
    # execution, occurrence), approvals by fingerprint, commands by id.
    # Other producers' events may name a command the console does not hold; the console's
    # own command events carry their occurrence (``_named``).
    by_id = pk is not None
    seeds = _SEEDS[by_id].run(q=q, pk=pk, tenant_ids=tenant_ids)
    seed_approvals = _SEED_APPROVALS[by_id].run(q=q, pk=pk, tenant_ids=tenant_ids)
    seed_commands = _SEED_COMMANDS.run(pk=pk, tenant_ids=tenant_ids) if by_id else []
    occurrence_ids = {o for _, o, _ in seeds if o} | {o for o, _ in seed_approvals}
    occurrence_ids |= {o for _, o in seed_commands} | ({pk} if pk is not None else set())
    fingerprints = {f for f, _, _ in seeds if f} | {f for _, f in seed_approvals if f}
    command_ids = {c for _, _, c in seeds if c} | {c for c, _ in seed_commands}

    # 2. The approvals of those occurrences and fingerprints, then the occurrences.
    approvals = _APPROVALS.run(
        tenant_ids=tenant_ids, occurrence_ids=list(occurrence_ids), fingerprints=list(fingerprints)
    )
    occurrence_ids |= {a.occurrence_id for a in approvals}
    fingerprints |= {a.fingerprint for a in approvals if a.fingerprint}
    ranked = sorted(occurrence_ids, key=str)
    occurrences = _OCCURRENCES.run(tenant_ids=tenant_ids, occurrence_ids=ranked[:OCCURRENCE_LIMIT])
    limited = len(ranked) > OCCURRENCE_LIMIT
    occurrence_ids = {o.pk for o in occurrences}

    # 3. Commands, their adapter invocations and the operators' decisions about them.
    commands = _COMMANDS.run(
        tenant_ids=tenant_ids, occurrence_ids=list(occurrence_ids), command_ids=list(command_ids)
    )
    console_command_ids = [c.pk for c in commands]
    command_ids |= set(console_command_ids)
    invocations = _INVOCATIONS.run(command_ids=console_command_ids)
    decisions = _DECISIONS.run(command_ids=console_command_ids)

    # 4. The audit events of all of it: every approved decision and committed effect (what
    # the verdict cannot do without), and the newest others; then their later deliveries.
    chain_values: dict[str, Any] = {
        "q": q,
        "pk": pk,
        "tenant_ids": tenant_ids,
        "occurrence_ids": list(occurrence_ids),
        "fingerprints": list(fingerprints),
        "command_ids": list(command_ids),
    }
    # Read as plain values, never as models: a chain of hundreds of events is read on every
    # request, and building (and decoding the payload of) each model cost more than the
    # query. Only an effect's receipt is read from the payload.
    newest = _newest(by_id, chain_values)
    if len(newest) < EVENT_LIMIT:
        # The whole chain: its decisive events are among the newest, and counted.
        decisive, total = [], len(newest)
    else:
        # Found by the audit_decisive_* indexes, however many refusals surround them.
        decisive = _DECISIVE[by_id].run(fixed={"limit": DECISIVE_LIMIT}, **chain_values)
        total = sum(_COUNT[by_id].run(**chain_values))
    if connection.vendor == "postgresql":
        facts_of = {row[0]: EventFact._make(row) for row in decisive + newest}
    else:
        texts: dict[Any, str] = {}  # the chain's few occurrence and command ids, once
        facts_of = {row[0]: _event_fact_of_row(row, texts) for row in decisive + newest}
    events = sorted(facts_of.values(), key=lambda e: e.pk)
    deliveries = _DELIVERIES.run(tenant_ids=tenant_ids, read=[e.pk for e in events])

    command_of_approval = {c.approval_id: c for c in commands if c.approval_id}
    fingerprint_of_approval = {a.pk: a.fingerprint for a in approvals}
    facts = Facts(
        approvals=tuple(
            ApprovalFact(
                tenant_id=a.tenant_id,
                occurrence_id=str(a.occurrence_id),
                fingerprint=a.fingerprint,
                state=effective_approval_state(a.state, a.expires_at, now),
                consumed_by_execution=a.consumed_by_execution,
                command_id=_text(getattr(command_of_approval.get(a.pk), "pk", None)),
                approver=a.approver.get_username(),
                issued_at=a.issued_at,
                expires_at=a.expires_at,
                delivered_at=a.delivered_at,
            )
            for a in approvals
        ),
        commands=tuple(
            CommandFact(
                pk=str(c.pk),
                tenant_id=c.tenant_id,
                occurrence_id=str(c.occurrence_id),
                execution_id=c.execution_id,
                state=c.state,
                idempotency_key=c.idempotency_key,
                fingerprint=fingerprint_of_approval.get(c.approval_id or 0, ""),
            )
            for c in commands
        ),
        invocations=tuple(
            InvocationFact(
                command_id=str(i.command_id),
                number=i.number,
                kind=i.kind,
                outcome=i.outcome,
                receipt=i.receipt,
                justification=i.justification,
                message_id=i.message_id,
                execution_id=i.epoch.execution_id,
                started_at=i.started_at,
            )
            for i in invocations
        ),
        decisions=tuple(
            DecisionFact(
                command_id=str(d.command_id),
                action=d.action,
                operator=d.operator,
                finding=d.finding,
                created_at=d.created_at,
            )
            for d in decisions
        ),
        events=tuple(events),
        deliveries=tuple(
            DeliveryFact(
                original_pk=d.original_id,
                event_id=str(d.event_id),
                ingestion_id=d.ingestion_id,
                received_at=d.ingestion.received_at,
                line=d.line,
                same_payload=d.same_payload,
            )
            for d in deliveries
        ),
        events_total=total,
        events_newest=len(newest),
    )
    return Investigation(q, facts, occurrences, invocations, commands, limited)


# The approval's columns ``ApprovalFact`` is built from.
_APPROVAL_FIELDS = (
    "tenant_id",
    "occurrence_id",
    "fingerprint",
    "state",
    "expires_at",
    "consumed_by_execution",
    "issued_at",
    "delivered_at",
)


# The chain's newest events, by id but not along an index in id order: PostgreSQL would
# walk the primary key (or the tenant's (tenant, id) index) back from the newest event,
# filtering, until it had found EVENT_LIMIT of the chain's. For a chain of thousands of
# events a month old that is every event written since (300,000 newer events: 113 ms,
# where finding the chain's events through their own indexes and sorting them takes 2-4
# ms, however old they are). ``_newest_rows`` reads along an index only where the index
# holds nothing but the chain's events, in id order.
_NEWEST_FIRST = (F("id") + 0).desc()
_OLDEST_FIRST = (F("id") + 0).asc()  # the decisive events, for the same reason


# What ``EventFact`` holds, in the order ``_event_fact_of_row`` reads it.
_EVENT_COLUMNS = (
    "pk",
    "event_id",
    "kind",
    "tenant_id",
    "source_time",
    "token_fingerprint",
    "decision",
    "reason_code",
    "execution_id",
    "message_id",
    "command_id",
    "occurrence_id",
    "receipt_value",  # the payload's "receipt", decoded, or None
    "ingestion_id",
    "ingested_at",
)


def _event_fact_of_row(row: tuple[Any, ...], texts: dict[Any, str]) -> EventFact:
    """An event read by ``_EVENT_COLUMNS`` (elsewhere than on PostgreSQL). ``texts``
    keeps the text of each UUID seen: a chain's events name the same few occurrences and
    commands hundreds of times."""
    (
        pk,
        event_id,
        kind,
        tenant_id,
        source_time,
        fingerprint,
        decision,
        reason_code,
        execution_id,
        message_id,
        command_id,
        occurrence_id,
        receipt,
        ingestion_id,
        ingested_at,
    ) = row
    return EventFact(
        pk,
        str(event_id),
        kind,
        tenant_id,
        source_time,
        fingerprint,
        decision,
        reason_code,
        execution_id,
        message_id,
        ""
        if command_id is None
        else texts.get(command_id) or texts.setdefault(command_id, str(command_id)),
        ""
        if occurrence_id is None
        else texts.get(occurrence_id) or texts.setdefault(occurrence_id, str(occurrence_id)),
        # Only an effect event's receipt names an effect.
        receipt if isinstance(receipt, str) and kind.startswith(vocabulary.EFFECT_PREFIX) else "",
        ingestion_id,
        ingested_at,
    )


# --- the reads, compiled once per process (approvals.compiled) -----------------------------
# Their values are parameters: ``q`` (the id asked for), ``pk`` (it read as a UUID, if it
# is one), and lists whose lengths each build is given. An empty list's condition is left
# out (it matches nothing), as Django leaves out an empty ``__in``.

_UUID: Field[Any, Any] = UUIDField()
_TEXT: Field[Any, Any] = CharField()
_TENANT = Tenant._meta.pk


def _tenants(size: int) -> ParamList:
    return ParamList("tenant_ids", size, _TENANT)


def _in(lookup: str, name: str, size: int, field: Any) -> Q:
    """``lookup__in`` the list ``name``; nothing for an empty one."""
    if not size:
        return Q(pk__in=[])
    return Q(**{f"{lookup}__in": ParamList(name, size, field)})


# The fingerprint's and the execution's indexes hold only events that have one; the
# conditions that say so are written into the statements (compiled.Literal), so that
# PostgreSQL can use those indexes in a prepared statement's generic plan. (Never an empty
# value is looked up: ``q`` is not empty, nor is any fingerprint gathered.)
_HAS_FINGERPRINT = ~Q(token_fingerprint=Literal(""))
_HAS_EXECUTION = ~Q(execution_id=Literal(""))
# DECISIVE_EVENTS, the audit_decisive_* indexes' condition, in the statements' text.
_DECISIVE_EVENTS = Q(decision=Literal(ClaimDecision.APPROVED)) | Q(
    kind=Literal(AuditKind.EFFECT_COMMITTED)
)


def _fingerprint_is(value: Any) -> Q:
    return Q(token_fingerprint=value) & _HAS_FINGERPRINT


def _named(by_id: bool) -> Q:
    """What the id names (``named`` in ``_investigation_get``), as parameters."""
    named = _fingerprint_is(Param("q", _TEXT)) | (
        Q(execution_id=Param("q", _TEXT)) & _HAS_EXECUTION
    )
    if by_id:
        named |= Q(occurrence_id=Param("pk", _UUID)) | Q(
            command_id=Param("pk", _UUID), ingestion__isnull=False
        )
    return named


def _chain_arms(
    by_id: bool, occurrence_ids: int, fingerprints: int, command_ids: int
) -> list[tuple[Q, bool]]:
    """The ways the chain names an event, each with whether an index holds that arm's
    events in id order (one value of an indexed column: the fingerprint's, execution's and
    occurrence's, and the ingested events' command index, end with the id)."""
    arms = [
        (_fingerprint_is(Param("q", _TEXT)), True),
        (Q(execution_id=Param("q", _TEXT)) & _HAS_EXECUTION, True),
    ]
    if by_id:
        arms += [
            (Q(occurrence_id=Param("pk", _UUID)), True),
            (Q(command_id=Param("pk", _UUID), ingestion__isnull=False), True),
        ]
    if occurrence_ids:
        arms.append(
            (_in("occurrence_id", "occurrence_ids", occurrence_ids, _UUID), occurrence_ids == 1)
        )
    if fingerprints:
        arms.append(
            (
                _in("token_fingerprint", "fingerprints", fingerprints, _TEXT) & _HAS_FINGERPRINT,
                fingerprints == 1,
            )
        )
    if command_ids:
        arms.append(
            (
                _in("command_id", "command_ids", command_ids, _UUID) & Q(ingestion__isnull=False),
                command_ids == 1,
            )
        )
    return arms


def _chain_q(by_id: bool, occurrence_ids: int, fingerprints: int, command_ids: int) -> Q:
    chain = Q()
    for arm, _ in _chain_arms(by_id, occurrence_ids, fingerprints, command_ids):
        chain |= arm
    return chain


def _event_rows(tenant_ids: int, condition: Q) -> QuerySet[AuditEvent, tuple[Any, ...]]:
    rows = AuditEvent.objects.filter(tenant_id__in=_tenants(tenant_ids)).filter(condition)
    if connection.vendor == "postgresql":
        # Each row as ``EventFact`` holds it, made by PostgreSQL: the ids as its text of
        # them (which is str(uuid)), "" for none, and an effect's receipt if it is a
        # string. Hundreds of UUIDs loaded and turned back into text, and a JSON value
        # decoded per row, cost more than the rest of the rows.
        rows = rows.annotate(
            receipt_type=Func(F("data__receipt"), function="jsonb_typeof", output_field=_TEXT)
        )
        return rows.annotate(
            event_text=Cast("event_id", TextField()),
            command_text=Coalesce(
                Cast("command_id", TextField()), Value(""), output_field=TextField()
            ),
            occurrence_text=Coalesce(
                Cast("occurrence_id", TextField()), Value(""), output_field=TextField()
            ),
            receipt_text=Case(
                When(
                    kind__startswith=vocabulary.EFFECT_PREFIX,
                    receipt_type="string",
                    then=KT("data__receipt"),
                ),
                default=Value(""),
                output_field=TextField(),
            ),
        ).values_list(*_EVENT_FACT_COLUMNS)
    return rows.annotate(receipt_value=F("data__receipt")).values_list(*_EVENT_COLUMNS)


# On PostgreSQL, ``EventFact``'s fields in its order: each row is one (``EventFact._make``).
_EVENT_FACT_COLUMNS = tuple(
    {
        "event_id": "event_text",
        "command_id": "command_text",
        "occurrence_id": "occurrence_text",
        "receipt_value": "receipt_text",
    }.get(c, c)
    for c in _EVENT_COLUMNS
)


def _chain_rows(
    by_id: bool, tenant_ids: int, occurrence_ids: int, fingerprints: int, command_ids: int
) -> QuerySet[AuditEvent, tuple[Any, ...]]:
    return _event_rows(tenant_ids, _chain_q(by_id, occurrence_ids, fingerprints, command_ids))


def _newest_rows(
    limit: int,
    by_id: bool,
    tenant_ids: int,
    occurrence_ids: int,
    fingerprints: int,
    command_ids: int,
) -> QuerySet[AuditEvent, tuple[Any, ...]]:
    """The chain's newest ``limit`` events, the chain sorted whole (SQLite; PostgreSQL
    reads them by ``_newest_statement``)."""
    return _chain_rows(by_id, tenant_ids, occurrence_ids, fingerprints, command_ids).order_by(
        _NEWEST_FIRST
    )[:limit]


def _newest_statement(
    limit: int,
    by_id: bool,
    tenant_ids: int,
    occurrence_ids: int,
    fingerprints: int,
    command_ids: int,
) -> tuple[str, list[Any]]:
    """The chain's newest ``limit`` events on PostgreSQL: each arm's newest ``limit`` first,
    then the newest of those. An arm that an index holds in id order (for one tenant) is
    read backwards along it, ``limit`` rows at most however long the chain, and any other
    arm is found through its index and sorted (``_NEWEST_FIRST``), never by walking the
    table's ids. The arms, each in id order, are merged and the first row of each id kept
    (``DISTINCT ON``): a UNION would hash every row read whole to drop the arms' overlap."""
    sqls: list[str] = []
    params: list[Any] = []
    for arm, ordered in _chain_arms(by_id, occurrence_ids, fingerprints, command_ids):
        part = _event_rows(tenant_ids, arm).order_by(
            "-id" if ordered and tenant_ids == 1 else _NEWEST_FIRST
        )[:limit]
        sql, part_params = part.query.sql_with_params()
        sqls.append(f"({sql})")
        params.extend(part_params)
    # The first column is the event's id (_EVENT_COLUMNS); ``limit`` is an int.
    chain = " UNION ALL ".join(sqls)
    return (
        f"SELECT DISTINCT ON (1) * FROM ({chain}) AS chain ORDER BY 1 DESC LIMIT {int(limit)}",  # noqa: S608
        params,
    )


_SEEDS = {
    by_id: Compiled[tuple[str, Any, Any]](
        lambda tenant_ids, by_id=by_id: (
            AuditEvent.objects.filter(tenant_id__in=_tenants(tenant_ids))
            .filter(_named(by_id))
            .order_by()
            .values_list("token_fingerprint", "occurrence_id", "command_id")
            .distinct()[:SEED_LIMIT]
        )
    )
    for by_id in (False, True)
}
_SEED_APPROVALS = {
    by_id: Compiled[tuple[Any, str]](
        lambda tenant_ids, by_id=by_id: (
            Approval.objects.filter(tenant_id__in=_tenants(tenant_ids))
            .filter(
                Q(fingerprint=Param("q", _TEXT))
                | (Q(occurrence_id=Param("pk", _UUID)) if by_id else Q())
            )
            .order_by()
            .values_list("occurrence_id", "fingerprint")[:SEED_LIMIT]
        )
    )
    for by_id in (False, True)
}
_SEED_COMMANDS = Compiled[tuple[Any, Any]](
    lambda tenant_ids: (
        Command.objects.filter(tenant_id__in=_tenants(tenant_ids))
        .filter(Q(pk=Param("pk", _UUID)) | Q(occurrence_id=Param("pk", _UUID)))
        .order_by()
        .values_list("pk", "occurrence_id")[:SEED_LIMIT]
    )
)
_APPROVALS = Compiled[Approval](
    lambda tenant_ids, occurrence_ids, fingerprints: (
        Approval.objects.filter(tenant_id__in=_tenants(tenant_ids))
        .filter(
            _in("occurrence_id", "occurrence_ids", occurrence_ids, _UUID)
            | _in("fingerprint", "fingerprints", fingerprints, _TEXT)
        )
        .select_related("approver")
        # What ``ApprovalFact`` holds: the token's hash and the approver's password hash
        # stay in the database (fewer columns to compile, read and build).
        .only(*_APPROVAL_FIELDS, f"approver__{User.USERNAME_FIELD}")
        .order_by("issued_at", "pk")[:SEED_LIMIT]
    )
)
_OCCURRENCES = Compiled[Occurrence](
    lambda tenant_ids, occurrence_ids: (
        Occurrence.objects.filter(tenant_id__in=_tenants(tenant_ids))
        .filter(_in("pk", "occurrence_ids", occurrence_ids, _UUID))
        .select_related("tool", "tenant")
        # What the page shows of each: its tool's and tenant's names, its status and the
        # amounts of its current action, read in the same statement.
        .only("tenant_id", "tool_id", "status", "created_at", "tool__name", "tenant__name")
        .annotate(
            current_action=Subquery(
                Proposal.objects.filter(occurrence=OuterRef("pk"), is_current=True).values(
                    "canonical_action"
                )[:1]
            )
        )
        .order_by("created_at")
    )
)
_COMMANDS = Compiled[Command](
    lambda tenant_ids, occurrence_ids, command_ids: (
        Command.objects.filter(tenant_id__in=_tenants(tenant_ids))
        .filter(
            _in("occurrence_id", "occurrence_ids", occurrence_ids, _UUID)
            | _in("pk", "command_ids", command_ids, _UUID)
        )
        .order_by("created_at")[:SEED_LIMIT]
    )
)
_INVOCATIONS = Compiled[AdapterInvocation](
    lambda command_ids: (
        AdapterInvocation.objects.filter(_in("command_id", "command_ids", command_ids, _UUID))
        .select_related("epoch")
        .order_by("command_id", "number")
    )
)
_DECISIONS = Compiled[OperatorDecision](
    lambda command_ids: OperatorDecision.objects.filter(
        _in("command_id", "command_ids", command_ids, _UUID)
    ).order_by("created_at", "pk")
)
_NEWEST = {
    by_id: Compiled[tuple[Any, ...]](
        lambda limit, tenant_ids, occurrence_ids, fingerprints, command_ids, by_id=by_id: (
            _newest_rows(limit, by_id, tenant_ids, occurrence_ids, fingerprints, command_ids)
        )
    )
    for by_id in (False, True)
}
_NEWEST_STATEMENT = {
    by_id: CompiledStatement(
        lambda limit, tenant_ids, occurrence_ids, fingerprints, command_ids, by_id=by_id: (
            _newest_statement(limit, by_id, tenant_ids, occurrence_ids, fingerprints, command_ids)
        )
    )
    for by_id in (False, True)
}


def _newest(by_id: bool, chain_values: dict[str, Any]) -> list[tuple[Any, ...]]:
    if connection.vendor == "postgresql":
        return _NEWEST_STATEMENT[by_id].rows(fixed={"limit": EVENT_LIMIT}, **chain_values)
    return _NEWEST[by_id].run(fixed={"limit": EVENT_LIMIT}, **chain_values)


_DECISIVE = {
    by_id: Compiled[tuple[Any, ...]](
        lambda limit, tenant_ids, occurrence_ids, fingerprints, command_ids, by_id=by_id: (
            _chain_rows(by_id, tenant_ids, occurrence_ids, fingerprints, command_ids)
            .filter(_DECISIVE_EVENTS)
            .order_by(_OLDEST_FIRST)[:limit]
        )
    )
    for by_id in (False, True)
}
# How many events the chain holds, by tenant (one row per tenant, summed).
_COUNT = {
    by_id: Compiled[int](
        lambda tenant_ids, occurrence_ids, fingerprints, command_ids, by_id=by_id: (
            AuditEvent.objects.filter(tenant_id__in=_tenants(tenant_ids))
            .filter(_chain_q(by_id, occurrence_ids, fingerprints, command_ids))
            .order_by()
            .values("tenant_id")
            .annotate(n=models.Count("*"))
            .values_list("n", flat=True)
        )
    )
    for by_id in (False, True)
}
# The later deliveries of the events read, named by their ids in one parameter.
_DELIVERIES = Compiled[AuditDuplicateDelivery](
    lambda tenant_ids: (
        AuditDuplicateDelivery.objects.filter(
            tenant_id__in=_tenants(tenant_ids), original_id__in=ParamArray("read")
        )
        .select_related("ingestion")
        .order_by("id")
    )
)


# --- the page -------------------------------------------------------------------------------


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
        return _listing(self.values, TITLE_VALUES, separator=", ")


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
    later = Counter(d.original_pk for d in found.facts.deliveries)
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
            f"batch #{event.ingestion_id}, {_at(event.ingested_at)}"
            if event.ingestion_id is not None
            else f"this console, {_at(event.ingested_at)}"
        )
        rows.append(
            DeliveryRow(
                event_id=delivery.event_id,
                kind=event.kind,
                execution=reveal_html(event.execution_id),
                first=first,
                again=f"batch #{delivery.ingestion_id}, {_at(delivery.received_at)}, "
                f"line {delivery.line}",
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
    return {
        "assessment": assessment,
        "occurrence_links": links,
        "approval_rows": approval_rows,
        "command_rows": command_rows,
        "chain": chain_rows(found, tenant_names, every_step=every_step),
        "every_step": every_step,
        "every_step_url": _investigation_url(found.query, every_step=True),
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
