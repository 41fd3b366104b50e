"""``/api/v1/tools`` and ``/api/v1/actions/canonicalize``: the tool contracts, and what the
console would make of an action before it is proposed."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Literal

from django.http import (
    Http404,
    HttpRequest,
)
from ninja import Field, Router, Schema

from approvals.api import openapi
from approvals.api.base import runtime_key_of
from approvals.api.errors import AUTH_ERRORS, BODY_ERRORS, ErrorOut
from approvals.api.schemas import CanonicalizeIn, PriorDecisionOut
from approvals.models import (
    ToolContract,
)
from approvals.reviews.proposals import action_canonical, prior_rejections
from approvals.reviews.selectors import tool_contract, tool_contracts
from approvals.vocabulary import ExecutedBy
from approvals.web.presenters.review import quorum_rule

router = Router()


class ApprovalsNeededOut(Schema):
    rule: str = Field(..., description="The rule in words, as reviewers see it.")
    approvals_required: int = Field(
        ..., description="Distinct approvers needed (above the threshold, if one is set)."
    )
    quorum_amount_argument: str | None = Field(
        ...,
        description="The integer argument compared with a threshold; null: every call "
        "needs `approvals_required`.",
    )
    quorum_currency_argument: str | None = Field(
        ..., description="The argument holding the amount's ISO 4217 currency, if any."
    )
    quorum_thresholds_minor: dict[str, int] = Field(
        ...,
        description="Per currency, in its minor units: above its currency's threshold (or "
        "for a currency without one) a call needs `approvals_required`; otherwise 1.",
    )
    quorum_threshold_minor: int | None = Field(
        ...,
        description="The currency-blind threshold (no currency argument): above it a call "
        "needs `approvals_required`; otherwise 1.",
    )


class ToolOut(Schema):
    name: str
    description: str
    arguments_schema: dict[str, Any] = Field(
        ..., description="JSON Schema (2020-12) of the arguments; unknown keys are refused."
    )
    replay_safety: Literal["read_only", "idempotent_with_key", "effect_queryable", "unsafe"]
    risk: str
    executed_by: ExecutedBy = Field(
        ...,
        description="`console`: the console calls the tool after a claim; `runtime`: the "
        "runtime calls it and reports the effect.",
    )
    auto_admit: bool = Field(..., description="Admitted by policy without review (read-only).")
    approval_lifetime_seconds: int = Field(
        ..., description="How long an approval may be claimed after it is issued."
    )
    review_deadline_seconds: int | None = Field(
        None,
        description="A request nobody decided within this many seconds of its proposal is "
        "escalated (`escalated_at` on the occurrence); null: never.",
    )
    final_deadline_seconds: int | None = Field(
        None,
        description="A request nobody decided within this many seconds of its proposal ends "
        "`timed_out` (fail-closed: never approved); null: it waits until someone decides.",
    )
    reject_repeats: bool = Field(
        ...,
        description="A proposal repeating an action rejected earlier in its run is rejected "
        "without a review, with the original reason.",
    )
    approvals_needed: ApprovalsNeededOut
    version: int = Field(
        1,
        description="The contract's version: each registration that changes it (the MCP "
        "gateway's, say) adds one, audited as `tool_contract.registered`.",
    )


class ToolsOut(Schema):
    tools: list[ToolOut]


class CanonicalOut(Schema):
    tool: str
    arguments: dict[str, Any]
    canonical_action: str = Field(..., description="RFC 8785 JSON of `{tool, arguments}`.")
    action_digest: str = Field(..., description="SHA-256 (hex) of `canonical_action`.")
    approvals_needed: int = Field(..., description="Distinct approvers this call would need.")
    prior_decisions: list[PriorDecisionOut] = Field(
        default_factory=list,
        description="With `run_id`: the run's rejected (and timed-out) occurrences of this "
        "action, newest first (as a proposal's answer lists them). Empty without `run_id`.",
    )


def _seconds(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds())


def _tool_out(contract: ToolContract) -> dict[str, Any]:
    return {
        "name": contract.name,
        "description": contract.description,
        "arguments_schema": contract.json_schema,
        "replay_safety": contract.replay_safety,
        "risk": contract.risk,
        "executed_by": contract.executed_by,
        "auto_admit": contract.auto_admit,
        "approval_lifetime_seconds": int(contract.approval_lifetime.total_seconds()),
        "review_deadline_seconds": _seconds(contract.review_deadline),
        "final_deadline_seconds": _seconds(contract.final_deadline),
        "reject_repeats": contract.reject_repeats,
        "version": contract.version,
        "approvals_needed": {
            "rule": quorum_rule(contract),
            "approvals_required": contract.approvals_required,
            "quorum_amount_argument": contract.quorum_amount_argument or None,
            "quorum_currency_argument": contract.quorum_currency_argument or None,
            "quorum_thresholds_minor": contract.quorum_thresholds_minor or {},
            "quorum_threshold_minor": contract.quorum_threshold_minor,
        },
    }


@router.get(
    "/tools",
    response={200: ToolsOut, **AUTH_ERRORS},
    summary="Every tool contract",
    tags=["contracts"],
)
def tools(request: HttpRequest) -> dict[str, Any]:
    return {"tools": [_tool_out(c) for c in tool_contracts()]}


@router.get(
    "/tools/{name}",
    response={200: ToolOut, **AUTH_ERRORS, 404: ErrorOut},
    summary="One tool contract: its arguments' JSON Schema, replay safety, approvals needed",
    tags=["contracts"],
)
def tool_detail(request: HttpRequest, name: str) -> dict[str, Any]:
    # No contract's name holds a NUL character, which PostgreSQL text cannot even compare.
    contract = tool_contract(name) if "\x00" not in name else None
    if contract is None:
        raise Http404
    return _tool_out(contract)


@router.post(
    "/actions/canonicalize",
    response={200: CanonicalOut, **AUTH_ERRORS, **BODY_ERRORS},
    summary="The canonical form and digest of an action, without proposing it",
    description="Checks the action as a proposal would (the same 422 for an unknown tool "
    "or arguments outside the contract) and writes nothing.\n\n" + openapi.CONTRACT_RULES,
    tags=["contracts"],
)
def canonicalize_action(request: HttpRequest, payload: CanonicalizeIn) -> dict[str, Any]:
    contract, action = action_canonical(payload.tool, payload.arguments)
    prior = []
    if payload.run_id is not None:
        prior = [
            {
                "occurrence_id": str(p.occurrence_id),
                "decision": p.decision,
                "reason": p.reason,
                "decided_at": p.decided_at,
                "decided_by": p.decided_by,
            }
            for p in prior_rejections(
                tenant=runtime_key_of(request).tenant,
                run_id=payload.run_id,
                action_digest=action.digest,
                with_timeouts=True,
            )
        ]
    return {
        "tool": contract.name,
        "arguments": json.loads(action.canonical)["arguments"],
        "canonical_action": action.canonical,
        "action_digest": action.digest,
        "approvals_needed": contract.approvals_needed(payload.arguments),
        "prior_decisions": prior,
    }
