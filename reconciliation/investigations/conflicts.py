"""Other producers' word about this console's approvals: evidence to show, not facts the
verdict rests on.

Any runtime key may ingest audit events naming any fingerprint or command. Were they read
as the console's own, one ``claim.approved`` with a real approval's fingerprint and another
execution id would turn the verdict into "control failure" on nobody's word but its
sender's. So ``partition`` sets apart the ingested events about an approval this console
issued or a command it created: the verdict about them rests on the console's own events
(those written with no ingestion). ``conflicts`` then shows the set-apart events that
contradict the console's records (another approved execution, another receipt), each with
the producer that sent it. An event about anything else (another system's approvals) is
the only evidence there is, and the verdict reads it as before.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from reconciliation.investigations.facts import (
    _EFFECT_INVOCATION_KINDS,
    COMMITTED_KIND,
    EventFact,
    Facts,
)
from reconciliation.investigations.wording import short

FpKey = tuple[int, str]

SECOND_APPROVED_EXECUTION = "second_approved_execution"


UNADMITTED_APPROVED_EXECUTION = "unadmitted_approved_execution"


OTHER_RECEIPT = "other_receipt"


TITLES = {
    SECOND_APPROVED_EXECUTION: "An external producer reports a second approved execution",
    UNADMITTED_APPROVED_EXECUTION: "An external producer reports an approved execution this "
    "console never admitted",
    OTHER_RECEIPT: "An external producer reports an effect this console did not record",
}


@dataclass(frozen=True)
class Conflict:
    """What one producer's events say against the console's records about one approval or
    command: shown to investigate, never judged."""

    code: str
    producer: str  # "runtime key “legacy-worker”"
    facts: tuple[str, ...]

    @property
    def title(self) -> str:
        return TITLES[self.code]


@dataclass(frozen=True)
class _Ours:
    """What the console's own records say: its approvals' fingerprints with the executions
    it admitted, and its commands with their executions and receipts."""

    executions: dict[FpKey, set[str]]
    commands: dict[str, str]  # command id -> its execution
    receipts: dict[str, set[str]]


@dataclass(frozen=True)
class Partition:
    own: tuple[EventFact, ...]  # what the verdict reads
    about_ours: tuple[EventFact, ...]  # other producers' events about the console's own
    ours: _Ours


def _ours(facts: Facts) -> _Ours:
    executions: dict[FpKey, set[str]] = defaultdict(set)
    for approval in facts.approvals:
        if approval.fingerprint:
            admitted = executions[(approval.tenant_id, approval.fingerprint)]
            if approval.consumed_by_execution:
                admitted.add(approval.consumed_by_execution)
    commands = {c.pk: c.execution_id for c in facts.commands}
    receipts: dict[str, set[str]] = defaultdict(set)
    for invocation in facts.invocations:
        if invocation.kind in _EFFECT_INVOCATION_KINDS and invocation.receipt:
            receipts[invocation.command_id].add(invocation.receipt)
    for event in facts.events:
        if event.is_ingested:
            continue
        if event.is_approved_claim and event.fingerprint:
            admitted = executions[(event.tenant_id, event.fingerprint)]
            if event.execution_id:
                admitted.add(event.execution_id)
        if event.command_id:
            commands.setdefault(event.command_id, "")
            if event.kind == COMMITTED_KIND and event.receipt:
                receipts[event.command_id].add(event.receipt)
    return _Ours(dict(executions), commands, dict(receipts))


def _is_about_ours(event: EventFact, ours: _Ours) -> bool:
    return (event.tenant_id, event.fingerprint) in ours.executions or (
        bool(event.command_id) and event.command_id in ours.commands
    )


def partition(facts: Facts) -> Partition:
    """The events the verdict reads, and other producers' events about the console's own
    approvals and commands, set apart."""
    ours = _ours(facts)
    own: list[EventFact] = []
    about_ours: list[EventFact] = []
    for event in facts.events:
        (about_ours if event.is_ingested and _is_about_ours(event, ours) else own).append(event)
    return Partition(tuple(own), tuple(about_ours), ours)


def producer_of(event: EventFact, facts: Facts) -> str:
    name = facts.producers.get(event.ingestion_id or 0, "")
    if name:
        return f"runtime key “{name}”"
    return f"an unnamed producer (batch #{event.ingestion_id})"


def _sent(event: EventFact) -> str:
    return f"{event.kind}, producer event {short(event.event_id)}, batch #{event.ingestion_id}"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def conflicts(facts: Facts, part: Partition) -> list[Conflict]:
    """Each producer's events that contradict the console's records, grouped by producer,
    approval (or command) and kind of contradiction, in the order first seen."""
    ours = part.ours
    found: dict[tuple[str, str, str], list[str]] = {}
    for event in part.about_ours:
        producer = producer_of(event, facts)
        if event.is_approved_claim:
            key = (event.tenant_id, event.fingerprint)
            if key in ours.executions:
                admitted = ours.executions[key]
                subject = f"fingerprint {event.fingerprint}"
            else:
                execution = ours.commands.get(event.command_id, "")
                admitted = {execution} if execution else set()
                subject = f"command {short(event.command_id)}"
            if event.execution_id and event.execution_id in admitted:
                continue  # it agrees with the console
            execution = event.execution_id or "an unnamed execution"
            code = SECOND_APPROVED_EXECUTION if admitted else UNADMITTED_APPROVED_EXECUTION
            lines = found.setdefault((producer, subject, code), [])
            if not lines:
                lines.append(
                    f"This console's own records admit "
                    f"{', '.join(sorted(admitted)) if admitted else 'no execution'} "
                    f"for {subject}."
                )
            lines.append(
                _sentence(
                    f"{producer} reports {subject} approved for {execution} ({_sent(event)})."
                )
            )
        elif event.kind == COMMITTED_KIND and event.receipt and event.command_id in ours.receipts:
            recorded = ours.receipts[event.command_id]
            if event.receipt in recorded:
                continue
            subject = f"command {short(event.command_id)}"
            lines = found.setdefault((producer, subject, OTHER_RECEIPT), [])
            if not lines:
                lines.append(
                    f"This console recorded {subject}'s effect with receipt "
                    f"{', '.join(sorted(recorded))}."
                )
            lines.append(
                _sentence(
                    f"{producer} reports it committed with receipt {event.receipt} "
                    f"({_sent(event)})."
                )
            )
    return [
        Conflict(
            code,
            producer,
            (
                *lines,
                "Another producer's word is evidence to check, not this console's record: "
                f"ask the owner of {producer} what it ran, and with which token.",
            ),
        )
        for (producer, _, code), lines in found.items()
    ]
