"""The verdict, a pure function of the facts: which of the five stories the records tell
(control failure, idempotent-execution failure, duplicated audit delivery, healthy
redelivery, the control working), and what the records cannot tell.

About an approval or command of this console, the verdict reads the console's own events
only; what other producers say about them is shown as conflicts (``conflicts``)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from approvals import vocabulary
from approvals.models import Command
from reconciliation.investigations.conflicts import Conflict, Partition, conflicts, partition
from reconciliation.investigations.duplicates import duplicated_delivery
from reconciliation.investigations.facts import (
    _EFFECT_INVOCATION_KINDS,
    _RESUMING_JUSTIFICATIONS,
    _UNSETTLED_STATES,
    APPROVED,
    COMMITTED_KIND,
    DUPLICATE_DELIVERY,
    REDELIVERED_KIND,
    REFUSALS,
    REPLAYED,
    CommandFact,
    DecisionFact,
    EventFact,
    Facts,
    InvocationFact,
)
from reconciliation.investigations.wording import LISTED, listing, plural, short, times, when
from reconciliation.models import AdapterInvocation, OperatorDecision

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
    next_step: str  # what an operator does about it, in one sentence


# Worst first: the order verdicts are listed in.
STORIES: dict[str, Story] = {
    CONTROL_FAILURE: Story(
        "Control failure",
        "alarm",
        "One approval authorized more than one execution: the single-use claim did not hold.",
        "Treat it as an incident: revoke the tool's outstanding approvals, stop the runtime "
        "that claimed twice, and compensate the extra effects from their timelines.",
    ),
    IDEMPOTENT_EXECUTION_FAILURE: Story(
        "Idempotent execution failure",
        "alarm",
        "Authorization held, but one command had more than one effect at the adapter: its "
        "idempotency key did not stop a second effect.",
        "Compensate the extra effect from the command's timeline, and tell the adapter's owner "
        "that the remote ignored the key.",
    ),
    DUPLICATED_AUDIT_DELIVERY: Story(
        "Duplicated audit delivery",
        "warn",
        "One producer event reached the audit trail more than once. It records one decision: "
        "counting rows would overstate what happened.",
        "Nothing to undo: count decisions, not rows, and ask the producer why it sent the "
        "event again.",
    ),
    HEALTHY_REDELIVERY: Story(
        "Healthy redelivery",
        "ok",
        "A claim or a command was delivered again and resolved to the existing command: one "
        "execution, one command, no second effect.",
        "Nothing to do: the retry found the existing command and caused no second effect.",
    ),
    CONTROL_WORKING: Story(
        "Control working",
        "ok",
        "The approval authorized one execution; other executions that presented it were "
        "refused as replays.",
        "Nothing to undo; if nobody expected a replay, find the runtime that presented the "
        "spent token (its execution ids are below).",
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
    # Other producers' events that contradict the console's records: shown, not judged.
    conflicts: tuple[Conflict, ...] = ()
    # The flow as it ran, named when no story applies: "Normal: 1 approval → 1 command → …".
    normal: str = ""

    @property
    def codes(self) -> list[str]:
        return [v.code for v in self.verdicts]

    @property
    def insufficient(self) -> bool:
        return not self.verdicts and bool(self.gaps)

    @property
    def tone(self) -> str:
        tone = self.verdicts[0].tone if self.verdicts else "wait" if self.gaps else "ok"
        # A contradiction to investigate is never all right.
        return "warn" if self.conflicts and tone in ("ok", "wait") else tone


FpKey = tuple[int, str]


@dataclass
class _Index:
    """The facts looked up the ways the rules need them."""

    facts: Facts
    # The events the verdict reads: the console's own about its approvals and commands,
    # anyone's about anything else (``conflicts.partition``).
    part: Partition
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

    @property
    def events(self) -> tuple[EventFact, ...]:
        return self.part.own

    def command_fingerprint(self, command_id: str) -> FpKey | None:
        command = self.commands.get(command_id)
        if command is not None and command.fingerprint:
            return (command.tenant_id, command.fingerprint)
        for key, commands in self.approved_commands.items():
            if command_id in commands:
                return key
        return None


def _index(facts: Facts) -> _Index:
    index = _Index(facts, partition(facts))
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
    index.claims = [e for e in index.events if e.is_claim]
    for event in index.events:
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
            f"{plural(len(executions), 'execution')}: {', '.join(sorted(executions))}."
        )
        for execution, sources in sorted(executions.items()):
            facts.append(f"{execution}: {listing(sources)}.")
        commands = sorted(index.approved_commands.get(key, set()))
        if len(commands) > 1:
            facts.append(
                f"{plural(len(commands), 'command')} came of it: "
                f"{', '.join(short(c) for c in commands)}."
            )
        console = index.console_approved.get(key, set())
        if console and set(executions) - console:
            others = ", ".join(sorted(set(executions) - console))
            facts.append(
                f"The approval row is consumed by {', '.join(sorted(console))} only; the "
                f"approval of {others} is in the audit trail alone."
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
            f"key: {listing(seen)}."
        )
        calls = [i for i in index.invocations.get(command_id, []) if i.kind == "execute"]
        if calls:
            facts.append(f"The adapter was asked to execute it {times(len(calls))}.")
        for call in calls:
            if call.outcome == AdapterInvocation.Outcome.ABANDONED and call.receipt:
                facts.append(
                    f"Invocation {call.number} was given up as abandoned, yet its answer "
                    f"arrived later with receipt {call.receipt}: that call reached the remote."
                )
        for decision in index.decisions.get(command_id, []):
            if decision.action == OperatorDecision.Action.ACCEPT_AMBIGUITY:
                facts.append(
                    f"{decision.operator} accepted the ambiguity at {when(decision.created_at)}: "
                    "a duplicate was possible, and was accepted."
                )
    return facts, failed


def _healthy_redelivery(index: _Index, excluded_fps: set[FpKey], failed: set[str]) -> list[str]:
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
            e for e in index.events if e.kind == REDELIVERED_KIND and e.command_id == command_id
        ]
        invocations = index.invocations.get(command_id, [])
        resumed = [i for i in invocations if i.justification in _RESUMING_JUSTIFICATIONS]
        if not (duplicates or redelivered or resumed):
            continue
        if duplicates:
            lines.append(
                f"Execution {execution} claimed the token {times(len(duplicates) + 1)}: "
                f"approved once, then duplicate_delivery {times(len(duplicates))}, answered "
                f"with the same command {short(command_id)}."
            )
        if redelivered:
            states = sorted(
                {e.reason_code.removeprefix(vocabulary.ALREADY_PREFIX) for e in redelivered}
            )
            lines.append(
                f"The queue delivered command {short(command_id)} again "
                f"{times(len(redelivered))} ({REDELIVERED_KIND}); its effect was already "
                f"{' or '.join(s for s in states if s) or 'settled'}, so nothing was called."
            )
        if resumed:
            reasons = ", ".join(sorted({i.justification for i in resumed}))
            lines.append(
                f"{plural(len(resumed), 'later delivery', 'later deliveries')} found the "
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
            f"{times(len(invocations)) if invocations else 'never'}; {state}{receipt}."
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
            f"{e.execution_id or 'an unnamed execution'} at {when(e.source_time)}"
            f" ({e.decision}{', ' + e.reason_code if e.reason_code else ''})"
            for e in replays[:LISTED]
        ]
        lines.append(
            f"{plural(len(replays), 'attempt')} by other executions refused as replayed: "
            f"{listing(attempts, total=len(replays))}."
        )
        others = [e for e in refused if e.decision != REPLAYED]
        if others:
            lines.append(
                f"Also refused: {listing([f'{e.execution_id} ({e.decision})' for e in others])}."
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
            f"{plural(n, 'approved decision')} for fingerprint {fingerprint} name no "
            "execution: one execution cannot be told from several."
        )
    if index.no_fingerprint_approved:
        gaps.append(
            f"{plural(index.no_fingerprint_approved, 'approved decision')} carry no token "
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
    for event in index.events:
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
    delivered_twice = duplicated_delivery(facts)
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
            "None of the five stories: nothing was replayed, delivered twice or executed "
            "twice. Nothing to do unless the effect itself is wrong (its timeline says)."
        )
    contradicted = conflicts(facts, index.part)
    if contradicted:
        summary += (
            " Another producer's events contradict this console's records: see the "
            "conflicts to investigate."
        )
    normal = "" if verdicts or gaps else normal_flow(facts)
    return Assessment(tuple(verdicts), tuple(gaps), summary, tuple(contradicted), normal)


# Effect states in which the remote did act (a compensation undid an effect that was there).
_ACTED = ("committed", "compensated")


def _state_words(state: str) -> str:
    try:
        return str(Command.State(state).label).lower()
    except ValueError:
        return state.replace("_", " ")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def normal_flow(facts: Facts) -> str:
    """The flow none of the stories describe, named with what it counts: "Normal: 1
    approval → 1 command → 1 effect, committed"."""
    effects = sum(1 for c in facts.commands if c.state in _ACTED)
    states = sorted({_state_words(c.state) for c in facts.commands})
    flow = " → ".join(
        (
            _count(len(facts.approvals), "approval"),
            _count(len(facts.commands), "command"),
            _count(effects, "effect"),
        )
    )
    return f"Normal: {flow}, {', '.join(states) if states else 'not claimed'}"
