"""Gathering an investigation's facts in a fixed number of queries, as one snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from approvals.models import (
    Command,
    Occurrence,
)
from approvals.reviews.selectors import effective_approval_state, parse_uuid, snapshot
from reconciliation.investigations import reads
from reconciliation.investigations.facts import (
    ApprovalFact,
    CommandFact,
    DecisionFact,
    DeliveryFact,
    EventFact,
    Facts,
    InvocationFact,
)
from reconciliation.investigations.reads_orm import Chain
from reconciliation.models import AdapterInvocation


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
    seeds = reads.seeds(q=q, pk=pk, tenant_ids=tenant_ids)
    seed_approvals = reads.seed_approvals(q=q, pk=pk, tenant_ids=tenant_ids)
    seed_commands = reads.seed_commands(pk=pk, tenant_ids=tenant_ids) if pk is not None else []
    occurrence_ids = {o for _, o, _ in seeds if o} | {o for o, _ in seed_approvals}
    occurrence_ids |= {o for _, o in seed_commands} | ({pk} if pk is not None else set())
    fingerprints = {f for f, _, _ in seeds if f} | {f for _, f in seed_approvals if f}
    command_ids = {c for _, _, c in seeds if c} | {c for c, _ in seed_commands}

    # 2. The approvals of those occurrences and fingerprints, then the occurrences.
    approvals = reads.approvals(
        tenant_ids=tenant_ids, occurrence_ids=list(occurrence_ids), fingerprints=list(fingerprints)
    )
    occurrence_ids |= {a.occurrence_id for a in approvals}
    fingerprints |= {a.fingerprint for a in approvals if a.fingerprint}
    ranked = sorted(occurrence_ids, key=str)
    occurrences = reads.occurrences(
        tenant_ids=tenant_ids, occurrence_ids=ranked[: reads.OCCURRENCE_LIMIT]
    )
    limited = len(ranked) > reads.OCCURRENCE_LIMIT
    occurrence_ids = {o.pk for o in occurrences}

    # 3. Commands, their adapter invocations and the operators' decisions about them.
    commands = reads.commands(
        tenant_ids=tenant_ids, occurrence_ids=list(occurrence_ids), command_ids=list(command_ids)
    )
    console_command_ids = [c.pk for c in commands]
    command_ids |= set(console_command_ids)
    invocations = reads.invocations(command_ids=console_command_ids)
    decisions = reads.decisions(command_ids=console_command_ids)

    # 4. The audit events of all of it: every approved decision and committed effect (what
    # the verdict cannot do without), and the newest others; then their later deliveries.
    chain = Chain(
        q=q,
        pk=pk,
        tenant_ids=tenant_ids,
        occurrence_ids=sorted(occurrence_ids, key=str),
        fingerprints=sorted(fingerprints),
        command_ids=sorted(command_ids, key=str),
    )
    newest = reads.newest(chain)
    if len(newest) < reads.EVENT_LIMIT:
        # The whole chain: its decisive events are among the newest, and counted.
        decisive, total = [], len(newest)
    else:
        # Found by the audit_decisive_* indexes, however many refusals surround them.
        decisive = reads.decisive(chain)
        total = reads.count(chain)
    facts_of = {row[0]: EventFact._make(row) for row in decisive + newest}
    events = sorted(facts_of.values(), key=lambda e: e.pk)
    deliveries = reads.deliveries(tenant_ids=tenant_ids, event_ids=[e.pk for e in events])
    batches = sorted({e.ingestion_id for e in events if e.ingestion_id is not None})
    producers = reads.producers(ingestion_ids=batches)

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
                copies=d.copies,
            )
            for d in deliveries
        ),
        events_total=total,
        events_newest=len(newest),
        producers=producers,
    )
    return Investigation(q, facts, occurrences, invocations, commands, limited)
