"""Typed views of the agent API's answers. Each keeps the JSON it was read from as ``raw``
(fields a newer console adds are there before this client names them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Effect states a command does not leave by itself (``not_sent`` and ``sending`` still move).
SETTLED_EFFECTS = frozenset(
    {"committed", "reconciled", "compensated", "rejected", "outcome_unknown"}
)

# Occurrence statuses that no longer wait for a person.
PENDING = "pending_review"
DECIDED_STATUSES = frozenset(
    {"approved", "rejected", "auto_admitted", "claimed", "revoked", "expired"}
)


def _dt(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Proposal:
    version: int
    action_digest: str
    canonical_action: str
    arguments: dict[str, Any]
    edited_by: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Proposal:
        return cls(
            version=int(data["version"]),
            action_digest=str(data["action_digest"]),
            canonical_action=str(data["canonical_action"]),
            arguments=dict(data.get("arguments") or {}),
            edited_by=_str_or_none(data.get("edited_by")),
        )


@dataclass(frozen=True)
class PriorDecision:
    occurrence_id: str
    decision: str
    reason: str
    decided_at: datetime | None
    decided_by: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PriorDecision:
        return cls(
            occurrence_id=str(data["occurrence_id"]),
            decision=str(data["decision"]),
            reason=str(data.get("reason") or ""),
            decided_at=_dt(data.get("decided_at")),
            decided_by=str(data.get("decided_by") or ""),
        )


@dataclass(frozen=True)
class Proposed:
    """The answer to a proposal: ``created`` is False when the same run repeated a
    ``client_ref`` and got its earlier occurrence back."""

    occurrence_id: str
    status: str
    proposal: Proposal
    rejection_reason: str
    prior_decisions: list[PriorDecision]
    created: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any], *, created: bool) -> Proposed:
        return cls(
            occurrence_id=str(data["occurrence_id"]),
            status=str(data["status"]),
            proposal=Proposal.from_json(data["proposal"]),
            rejection_reason=str(data.get("rejection_reason") or ""),
            prior_decisions=[PriorDecision.from_json(p) for p in data.get("prior_decisions", [])],
            created=created,
            raw=data,
        )


@dataclass(frozen=True)
class ApprovalState:
    state: str
    fingerprint: str | None
    issued_at: datetime | None
    expires_at: datetime | None
    token_delivered: bool
    consumed_by_execution: str | None
    consumed_at: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ApprovalState:
        return cls(
            state=str(data["state"]),
            fingerprint=_str_or_none(data.get("fingerprint")),
            issued_at=_dt(data.get("issued_at")),
            expires_at=_dt(data.get("expires_at")),
            token_delivered=bool(data.get("token_delivered")),
            consumed_by_execution=_str_or_none(data.get("consumed_by_execution")),
            consumed_at=_dt(data.get("consumed_at")),
        )


@dataclass(frozen=True)
class CommandRef:
    id: str
    idempotency_key: str
    state: str
    effect_state: str
    executed_by: str
    execution_id: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommandRef:
        return cls(
            id=str(data["id"]),
            idempotency_key=str(data["idempotency_key"]),
            state=str(data["state"]),
            effect_state=str(data["effect_state"]),
            executed_by=str(data["executed_by"]),
            execution_id=str(data["execution_id"]),
        )


@dataclass(frozen=True)
class Epoch:
    number: int
    execution_id: str
    justification: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Epoch:
        return cls(
            number=int(data["number"]),
            execution_id=str(data["execution_id"]),
            justification=str(data.get("justification") or ""),
        )


@dataclass(frozen=True)
class Occurrence:
    occurrence_id: str
    status: str
    tool: str
    run_id: str
    client_ref: str
    reason: str
    requested_by: str
    rejection_reason: str
    proposal: Proposal
    approval: ApprovalState | None
    command: CommandRef | None
    commands: list[CommandRef]
    epochs: list[Epoch]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def pending(self) -> bool:
        return self.status == PENDING

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Occurrence:
        approval = data.get("approval")
        command = data.get("command")
        return cls(
            occurrence_id=str(data["occurrence_id"]),
            status=str(data["status"]),
            tool=str(data.get("tool") or ""),
            run_id=str(data.get("run_id") or ""),
            client_ref=str(data.get("client_ref") or ""),
            reason=str(data.get("reason") or ""),
            requested_by=str(data.get("requested_by") or ""),
            rejection_reason=str(data.get("rejection_reason") or ""),
            proposal=Proposal.from_json(data["proposal"]),
            approval=ApprovalState.from_json(approval) if approval else None,
            command=CommandRef.from_json(command) if command else None,
            commands=[CommandRef.from_json(c) for c in data.get("commands", [])],
            epochs=[Epoch.from_json(e) for e in data.get("epochs", [])],
            raw=data,
        )


class Token:
    """An approval token. The raw value is shown by nothing but :meth:`reveal` (not by
    ``repr`` or ``str``, and it refuses to be pickled or deep-copied), so it cannot leak into
    a checkpoint, a trace or an error message by accident."""

    __slots__ = ("__value", "execution_id", "expires_at", "fingerprint", "redelivered")

    def __init__(
        self,
        value: str,
        *,
        fingerprint: str,
        expires_at: datetime | None,
        execution_id: str | None,
        redelivered: bool,
    ) -> None:
        self.__value = value
        self.fingerprint = fingerprint
        self.expires_at = expires_at
        self.execution_id = execution_id
        self.redelivered = redelivered

    def reveal(self) -> str:
        """The raw token: send it in a claim, never store or log it."""
        return self.__value

    def __repr__(self) -> str:
        return (
            f"Token(fingerprint={self.fingerprint!r}, execution_id={self.execution_id!r}, "
            f"redelivered={self.redelivered!r})"
        )

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("An approval token is not to be pickled or checkpointed.")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Token:
        return cls(
            str(data["token"]),
            fingerprint=str(data["fingerprint"]),
            expires_at=_dt(data.get("expires_at")),
            execution_id=_str_or_none(data.get("execution_id")),
            redelivered=bool(data.get("redelivered", False)),
        )


@dataclass(frozen=True)
class ClaimResult:
    """A claim that won (``approved``) or a redelivery of one (``duplicate_delivery``: the
    same execution claimed before; the command is the same)."""

    decision: str
    command_id: str
    idempotency_key: str
    executed_by: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def duplicate(self) -> bool:
        return self.decision == "duplicate_delivery"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClaimResult:
        return cls(
            decision=str(data["decision"]),
            command_id=str(data["command_id"]),
            idempotency_key=str(data["idempotency_key"]),
            executed_by=str(data["executed_by"]),
            raw=data,
        )


@dataclass(frozen=True)
class CommandDetail:
    command_id: str
    occurrence_id: str
    tool: str
    idempotency_key: str
    execution_id: str
    executed_by: str
    state: str
    effect_state: str
    invocation_count: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommandDetail:
        return cls(
            command_id=str(data["command_id"]),
            occurrence_id=str(data["occurrence_id"]),
            tool=str(data["tool"]),
            idempotency_key=str(data["idempotency_key"]),
            execution_id=str(data["execution_id"]),
            executed_by=str(data["executed_by"]),
            state=str(data["state"]),
            effect_state=str(data["effect_state"]),
            invocation_count=int(data.get("invocation_count") or 0),
            raw=data,
        )

    @property
    def settled(self) -> bool:
        """The effect is recorded (committed, rejected, unknown, ...), not still on its way."""
        return self.effect_state in SETTLED_EFFECTS

    @property
    def receipt(self) -> str | None:
        """The receipt of the last invocation that left one (the console's adapters)."""
        for invocation in reversed(self.raw.get("invocations") or []):
            if isinstance(invocation, dict) and invocation.get("receipt"):
                return str(invocation["receipt"])
        return None

    @property
    def detail(self) -> str | None:
        """What the last invocation said about its outcome (a refusal's reason)."""
        for invocation in reversed(self.raw.get("invocations") or []):
            if isinstance(invocation, dict) and invocation.get("detail"):
                return str(invocation["detail"])
        return None

    @property
    def interrupted(self) -> bool:
        """An authentication challenge refused the call and nobody resolved it yet: the
        console calls again once an admin renews the credentials."""
        return any(
            isinstance(i, dict) and i.get("resolved_at") is None
            for i in self.raw.get("interruptions") or []
        )


@dataclass(frozen=True)
class ToolContract:
    name: str
    description: str
    arguments_schema: dict[str, Any]
    replay_safety: str
    executed_by: str
    auto_admit: bool
    approval_lifetime_seconds: int
    reject_repeats: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolContract:
        return cls(
            name=str(data["name"]),
            description=str(data.get("description") or ""),
            arguments_schema=dict(data.get("arguments_schema") or {}),
            replay_safety=str(data["replay_safety"]),
            executed_by=str(data["executed_by"]),
            auto_admit=bool(data.get("auto_admit")),
            approval_lifetime_seconds=int(data.get("approval_lifetime_seconds") or 0),
            reject_repeats=bool(data.get("reject_repeats")),
            raw=data,
        )


@dataclass(frozen=True)
class CanonicalAction:
    tool: str
    arguments: dict[str, Any]
    canonical_action: str
    action_digest: str
    approvals_needed: int
    # With a ``run_id``: that run's rejected occurrences of the same action, newest first.
    prior_decisions: list[PriorDecision] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CanonicalAction:
        return cls(
            tool=str(data["tool"]),
            arguments=dict(data.get("arguments") or {}),
            canonical_action=str(data["canonical_action"]),
            action_digest=str(data["action_digest"]),
            approvals_needed=int(data.get("approvals_needed") or 1),
            prior_decisions=[PriorDecision.from_json(p) for p in data.get("prior_decisions") or []],
        )
