"""``POST /api/v1/claims``: the claim, and how a refusal is answered. The claim is
``reconciliation.claims.command_claim``: the authority's single-use claim, and the command's
delivery once it is committed."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Status

from approvals import metrics
from approvals.api.base import runtime_key_of
from approvals.api.errors import AUTH_ERRORS, BODY_ERRORS, error_body
from approvals.api.schemas import ClaimIn, ClaimOut, ClaimRefusedOut
from approvals.vocabulary import ClaimDecision
from reconciliation.claims import command_claim

router = Router()


@router.post(
    "/claims",
    response={200: ClaimOut, **AUTH_ERRORS, 403: ClaimRefusedOut, **BODY_ERRORS},
    summary="Claim an approval: the one command it allows, or why not",
    description="Presents the token with the action about to run and the execution running "
    "it. `200 approved` creates the command (once: the same execution and message again is "
    "`duplicate_delivery`, the same command). Any refusal is 403 with `decision` "
    "(`replayed`, `scope_mismatch`, `expired`, `revoked`, `unknown_token`) and `reason` "
    "beside the error envelope; an action outside its tool's contract matches no approval "
    "and is `scope_mismatch`, reason `action_invalid` (the contract: "
    "`GET /api/v1/tools/{name}`). A malformed body is 400/413/415/422 as everywhere.",
    # The id API v1 was published with, from when the view lived in approvals.api.
    operation_id="approvals_api_claim",
)
def claim(request: HttpRequest, payload: ClaimIn) -> Status[dict[str, Any]]:
    result = command_claim(
        tenant=runtime_key_of(request).tenant,
        token=payload.token,
        tool=payload.action.tool,
        arguments=payload.action.arguments,
        execution_id=payload.execution_id,
        message_id=payload.message_id or "",
        runtime_key=runtime_key_of(request),
    )
    metrics.claim_decided(result)
    if result.command is not None:
        return Status(
            200,
            {
                "decision": result.decision,
                "command_id": str(result.command.id),
                "idempotency_key": result.command.idempotency_key,
                "executed_by": result.command.executed_by,
            },
        )
    return Status(403, claim_refused_body(result.decision, result.reason))


_CLAIM_REFUSALS: dict[str, str] = {
    ClaimDecision.REPLAYED: "Another execution already claimed this approval.",
    ClaimDecision.SCOPE_MISMATCH: "The presented action is not one this approval covers.",
    ClaimDecision.EXPIRED: "The approval expired before it was claimed.",
    ClaimDecision.REVOKED: "An admin revoked this approval.",
    ClaimDecision.UNKNOWN_TOKEN: "There is no such token for this runtime key's tenant.",
}


def claim_refused_body(decision: str, reason: str) -> dict[str, Any]:
    """A claim refusal: ``decision`` and ``reason`` at the top, as clients have read them
    from the start, and the same refusal in the error envelope beside them."""
    message = _CLAIM_REFUSALS.get(decision, "The claim was refused.")
    return {
        "decision": decision,
        "reason": reason,
        **error_body(decision, f"{message} ({reason})", {"reason": reason}),
    }
