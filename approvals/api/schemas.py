"""The API's request and answer schemas shared by several resources (occurrences, tokens,
claims, commands)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field, Schema
from pydantic import ConfigDict, StrictStr

from approvals.api import openapi
from approvals.api.errors import ErrorBody
from approvals.vocabulary import (
    AdmittingDecision,
    EffectState,
    ExecutedBy,
    PriorDecision,
    RefusingDecision,
)


class StrictSchema(Schema):
    model_config = ConfigDict(extra="forbid")


class ProposeIn(StrictSchema):
    tool: StrictStr = Field(
        ...,
        min_length=1,
        max_length=100,
        pattern=openapi.NO_NUL,
        description="A tool contract's name (`GET /api/v1/tools`); another is 422 unknown_tool.",
        examples=["issue_refund"],
    )
    arguments: dict[str, Any] = Field(
        ...,
        description=openapi.CONTRACT_RULES,
        json_schema_extra=openapi.ARGUMENTS,
        examples=[openapi.REFUND_ARGUMENTS],
    )
    run_id: StrictStr = Field(
        ..., min_length=1, max_length=200, pattern=openapi.NO_NUL, examples=["run-1"]
    )
    reason: StrictStr = Field(
        ..., max_length=2000, pattern=openapi.NO_NUL, examples=["The customer asked for it."]
    )
    requested_by: StrictStr | None = Field(
        None, max_length=150, pattern=openapi.NO_NUL, examples=["alice@example.com"]
    )
    client_ref: StrictStr | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=openapi.NO_NUL,
        description="The runtime's own id of this call (a tool-call id): idempotency per "
        "`(run_id, client_ref)`.",
        examples=["call_0"],
    )


class ProposalOut(Schema):
    version: int
    action_digest: str
    canonical_action: str
    arguments: dict[str, Any] = Field(
        ..., description="The arguments of `canonical_action`, parsed: what a review covers."
    )
    edited_by: str | None = Field(
        ...,
        description="The reviewer who wrote this version (a change of the arguments), or "
        "null: the runtime's own proposal, or a renewal (the same action again).",
    )


class PriorDecisionOut(Schema):
    occurrence_id: str = Field(..., json_schema_extra=openapi.UUID)
    decision: PriorDecision
    reason: str
    decided_at: datetime | None
    decided_by: str = Field(
        ...,
        description="The reviewer, `policy` (a repeat rejected), or `console` (timed out: "
        "nobody decided before the contract's final deadline).",
    )


class ProposeOut(Schema):
    occurrence_id: str = Field(..., json_schema_extra=openapi.UUID)
    status: str
    proposal: ProposalOut
    rejection_reason: str = Field(
        ..., description="Why it was rejected (a repeat rejected by policy); empty otherwise."
    )
    prior_decisions: list[PriorDecisionOut] = Field(
        ...,
        description="Earlier occurrences of the same run with the same action (digest) that "
        "were rejected (or timed out: `decision` says which), with their reasons, newest "
        "first: a model retrying a rejected call should be told, not proposed again.",
    )


class ApprovalOut(Schema):
    state: str
    fingerprint: str | None
    issued_at: datetime
    expires_at: datetime
    token_delivered: bool
    consumed_by_execution: str | None
    consumed_at: datetime | None


class CommandOut(Schema):
    id: str = Field(..., json_schema_extra=openapi.UUID)
    idempotency_key: str
    state: str = Field(
        ..., description="The command's effect; `pending` means not sent (`effect_state`)."
    )
    effect_state: EffectState
    executed_by: ExecutedBy
    execution_id: str


class EpochOut(Schema):
    number: int
    execution_id: str
    justification: str
    created_at: datetime


class OccurrenceOut(Schema):
    occurrence_id: str = Field(..., json_schema_extra=openapi.UUID)
    status: str = Field(
        ...,
        description="pending_review, approved, rejected, auto_admitted, claimed, revoked, "
        "expired, or timed_out (nobody decided before the final deadline: fail-closed, "
        "not a rejection; propose again with a new client_ref to ask again).",
    )
    tool: str
    run_id: str
    reason: str
    requested_by: str
    client_ref: str
    rejection_reason: str
    admission_justification: str
    created_at: datetime
    review_deadline_at: datetime | None = Field(
        None,
        description="When the request is escalated if nobody has decided it (the tool "
        "contract's review deadline); null when the contract sets none.",
    )
    final_deadline_at: datetime | None = Field(
        None,
        description="When the request ends `timed_out` if nobody has decided it (the tool "
        "contract's final deadline); null when the contract sets none.",
    )
    escalated_at: datetime | None = Field(
        None,
        description="When its review deadline passed with nobody deciding; null otherwise. "
        "Still pending: a reviewer may decide it until the final deadline.",
    )
    proposal: ProposalOut
    approval: ApprovalOut | None
    command: CommandOut | None = Field(
        ..., description="The latest command (the last of `commands`), with its effect."
    )
    commands: list[CommandOut]
    epochs: list[EpochOut]
    next_attempt: EpochOut | None = Field(
        None,
        description="A new attempt admitted at a command the runtime executes itself (an "
        "operator accepted the ambiguity or admitted a retry), not yet run and reported: "
        "run it again and report the effect under this epoch's `execution_id`. Null "
        "otherwise (also while the console executes the command).",
    )


class TokenIn(StrictSchema):
    execution_id: StrictStr | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=openapi.NO_NUL,
        description="The execution that will claim: binds the approval to it, and lets it "
        "ask again (a re-delivery) while the approval is unclaimed.",
        examples=[openapi.EXECUTION_ID],
    )


class TokenOut(Schema):
    token: str
    fingerprint: str
    expires_at: datetime
    execution_id: str | None = Field(
        None, description="The execution the approval is bound to; null when picked up without one."
    )
    redelivered: bool = Field(
        False,
        description="True when this is a fresh token for the same execution; "
        "the previous one is void.",
    )


class ActionIn(StrictSchema):
    tool: StrictStr = Field(
        ..., min_length=1, max_length=100, pattern=openapi.NO_NUL, examples=["issue_refund"]
    )
    arguments: dict[str, Any] = Field(
        ...,
        description=openapi.CONTRACT_RULES,
        json_schema_extra=openapi.ARGUMENTS,
        examples=[openapi.REFUND_ARGUMENTS],
    )


class CanonicalizeIn(ActionIn):
    run_id: StrictStr | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=openapi.NO_NUL,
        description="With it, the answer lists this run's rejected occurrences of the same "
        "action (`prior_decisions`), so a runtime can tell a model why before proposing again.",
    )


class ClaimIn(StrictSchema):
    token: StrictStr = Field(
        ...,
        min_length=1,
        max_length=200,
        pattern=openapi.NO_NUL,
        description="The raw token from `POST /api/v1/occurrences/{occurrence_id}/token`.",
        examples=["apv_<the token picked up>"],
    )
    action: ActionIn = Field(
        ...,
        description="The action about to run: it must be the approved one (its canonical "
        "digest), or the claim is refused as scope_mismatch.",
    )
    execution_id: StrictStr = Field(
        ...,
        min_length=1,
        max_length=200,
        pattern=openapi.NO_NUL,
        description="The execution claiming; the one the token was picked up with, if any.",
        examples=[openapi.EXECUTION_ID],
    )
    message_id: StrictStr | None = Field(
        None, max_length=200, pattern=openapi.NO_NUL, examples=["msg-1"]
    )


class ClaimOut(Schema):
    decision: AdmittingDecision
    command_id: str = Field(..., json_schema_extra=openapi.UUID)
    idempotency_key: str
    executed_by: ExecutedBy = Field(
        ...,
        description="`console`: the console delivers the command to its adapter. `runtime`: "
        "call the tool yourself with `idempotency_key` and report the outcome with "
        "`POST /api/v1/commands/{command_id}/effect`.",
    )


class ClaimRefusedOut(Schema):
    decision: RefusingDecision
    reason: str
    error: ErrorBody = Field(
        ..., description="The same refusal in the API's error envelope (`code` = `decision`)."
    )
