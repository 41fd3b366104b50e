"""The facts an investigation reads, as plain values: what ``assess`` judges."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from approvals import vocabulary
from approvals.models import (
    Command,
)
from approvals.vocabulary import AuditKind, ClaimDecision
from reconciliation.models import AdapterInvocation

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
    def is_ingested(self) -> bool:
        """Sent by another producer (``POST /api/v1/audit/events``), not written by this
        console."""
        return self.ingestion_id is not None

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
    copies: int = 1  # lines of the batch that carried it, saying the same thing


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
    # The producer of each ingestion batch the events came in: its runtime key's name ("" if
    # the batch names none), by ingestion id.
    producers: Mapping[int, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.approvals or self.commands or self.events)
