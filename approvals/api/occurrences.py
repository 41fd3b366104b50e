"""``/api/v1/occurrences``: propose a tool call, read it (with a long-poll), find it by
``client_ref``, renew it, decide it with a reviewer's token, and pick up its approval's token."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Annotated, Any, Literal

from django.conf import settings
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
)
from django.utils.cache import add_never_cache_headers
from django.utils.http import parse_etags, quote_etag
from ninja import Field, Query, Router, Schema, Status
from ninja.errors import AuthenticationError
from pydantic import BeforeValidator, ConfigDict, StrictStr
from pydantic_core import PydanticCustomError

from approvals import metrics
from approvals.access import reviewer_tokens
from approvals.api import longpoll, openapi
from approvals.api.base import ReviewerTokenAuth, RuntimeKeyAuth, runtime_key_of
from approvals.api.errors import AUTH_ERRORS, BODY_ERRORS, ErrorOut
from approvals.api.schemas import (
    OccurrenceOut,
    ProposeIn,
    ProposeOut,
    StrictSchema,
    TokenIn,
    TokenOut,
)
from approvals.claims.delivery import approval_deliver, pickup_read
from approvals.errors import InputError
from approvals.models import (
    Command,
    Occurrence,
    Proposal,
    ReviewerToken,
    RuntimeKey,
)
from approvals.reviews import renewal
from approvals.reviews.decisions import occurrence_approve, occurrence_reject
from approvals.reviews.proposals import prior_rejections, proposal_record
from approvals.reviews.selectors import (
    approval_state,
    current_approval,
    current_proposal,
    occurrence_detail_queryset,
    occurrence_get_for_tenant,
    parse_uuid,
)
from approvals.reviews.selectors import occurrence_lookup as occurrence_of_client_ref
from approvals.vocabulary import ReviewOutcome, ReviewOutcomeLiteral

router = Router()


def _proposal_out(occurrence: Occurrence, proposal: Proposal | None = None) -> dict[str, Any]:
    """The current version: ``proposal`` when the caller has it (a new occurrence's one),
    else from the prefetched proposals."""
    proposal = proposal or current_proposal(occurrence)
    return {
        "version": proposal.version,
        "action_digest": proposal.action_digest,
        "canonical_action": proposal.canonical_action,
        "arguments": proposal.arguments,
        "edited_by": proposal.edited_by.get_username() if proposal.edited_by else None,
    }


def _prior_decisions_out(occurrence: Occurrence, proposed: Proposal) -> list[dict[str, Any]]:
    """Rejected occurrences of the run with the action the runtime proposed (``proposed``:
    version 1)."""
    return [
        {
            "occurrence_id": str(prior.occurrence_id),
            "decision": prior.decision,
            "reason": prior.reason,
            "decided_at": prior.decided_at,
            "decided_by": prior.decided_by,
        }
        for prior in prior_rejections(
            tenant=occurrence.tenant_id,
            run_id=occurrence.run_id,
            action_digest=proposed.action_digest,
            exclude=occurrence.pk,
            with_timeouts=True,
        )
    ]


@router.post(
    "/occurrences",
    response={200: ProposeOut, 201: ProposeOut, **AUTH_ERRORS, 409: ErrorOut, **BODY_ERRORS},
    summary="Propose a tool call for review",
    description="Idempotent per `(run_id, client_ref)`: the same run sending the same "
    "`client_ref` with the same action gets the same occurrence (200); with another action, "
    "409 `client_ref_conflict`. Another run may reuse a `client_ref`. The answer lists the "
    "run's earlier rejections of the same action (`prior_decisions`); a contract with "
    "`reject_repeats` rejects such a repeat at once (status `rejected`, the original reason "
    "in `rejection_reason`).\n\n" + openapi.CONTRACT_RULES,
)
def propose(request: HttpRequest, payload: ProposeIn) -> Status[dict[str, Any]]:
    proposed = proposal_record(
        runtime_key=runtime_key_of(request),
        tool=payload.tool,
        arguments=payload.arguments,
        run_id=payload.run_id,
        reason=payload.reason,
        requested_by=payload.requested_by or "",
        client_ref=payload.client_ref or "",
    )
    created, occurrence, proposal = proposed.created, proposed.occurrence, proposed.proposal
    if proposal is None:
        # A retry: the first occurrence as it is now (a reviewer may have decided or edited
        # it). A new one comes with what was written (its tool and its proposal).
        occurrence = occurrence_detail_queryset().get(pk=occurrence.pk)
    first = proposal or min(occurrence.proposals.all(), key=lambda p: p.version)
    metrics.proposal_received(occurrence, created)
    body = {
        "occurrence_id": str(occurrence.pk),
        "status": occurrence.status,
        "proposal": _proposal_out(occurrence, proposal),
        "rejection_reason": occurrence.rejection_reason,
        "prior_decisions": _prior_decisions_out(occurrence, first),
    }
    return Status(201 if created else 200, body)


def _get_occurrence(request: HttpRequest, occurrence_id: str) -> Occurrence:
    # The caller's tenant: a runtime key's, or a reviewer token's (GET and decisions).
    caller: RuntimeKey | ReviewerToken = request.auth  # type: ignore[attr-defined]
    if isinstance(caller, ReviewerToken):
        reviewer_tokens.reviewer_token_require_reviewer(caller)
    occurrence = occurrence_get_for_tenant(tenant=caller.tenant, occurrence_id=occurrence_id)
    if occurrence is None:
        raise Http404
    return occurrence


def _command_out(command: Command) -> dict[str, Any]:
    return {
        "id": str(command.id),
        "idempotency_key": command.idempotency_key,
        "state": command.state,
        "effect_state": command.effect_state,
        "executed_by": command.executed_by,
        "execution_id": command.execution_id,
    }


def _occurrence_out(occurrence: Occurrence) -> dict[str, Any]:
    """An occurrence read with ``approvals.reviews.selectors.occurrence_detail_queryset``, as the
    API shows it."""
    approval = current_approval(occurrence)
    commands = [_command_out(c) for c in occurrence.commands.all()]
    epochs = [
        {
            "number": e.number,
            "execution_id": e.execution_id,
            "justification": e.justification,
            "created_at": e.created_at,
        }
        for e in occurrence.epochs.all()
    ]
    return {
        "occurrence_id": str(occurrence.pk),
        "status": occurrence.status,
        "tool": occurrence.tool.name,
        "run_id": occurrence.run_id,
        "reason": occurrence.reason,
        "requested_by": occurrence.requested_by,
        "client_ref": occurrence.client_ref,
        "rejection_reason": occurrence.rejection_reason,
        "admission_justification": occurrence.admission_justification,
        "created_at": occurrence.created_at,
        "review_deadline_at": occurrence.review_deadline_at,
        "final_deadline_at": occurrence.final_deadline_at,
        "escalated_at": occurrence.escalated_at,
        "proposal": _proposal_out(occurrence),
        "approval": None
        if approval is None
        else {
            "state": approval_state(approval),
            "fingerprint": approval.fingerprint or None,
            "issued_at": approval.issued_at,
            "expires_at": approval.expires_at,
            "token_delivered": approval.delivered_at is not None,
            "consumed_by_execution": approval.consumed_by_execution or None,
            "consumed_at": approval.consumed_at,
        },
        "command": commands[-1] if commands else None,
        "commands": commands,
        "epochs": epochs,
        "next_attempt": _next_attempt(commands[-1] if commands else None, epochs),
    }


def _next_attempt(command: dict[str, Any] | None, epochs: list[dict[str, Any]]) -> Any:
    """A new attempt admitted at a command the runtime executes, which it has not yet run
    and reported (an operator's acceptance of the ambiguity, a retry): the runtime runs it
    under the admitted epoch's execution id. None otherwise."""
    if command is None or not epochs:
        return None
    epoch = max(epochs, key=lambda e: e["number"])
    waiting = (
        command["executed_by"] == Command.ExecutedBy.RUNTIME
        and command["state"] == Command.State.PENDING
        and epoch["execution_id"] != command["execution_id"]
    )
    return epoch if waiting else None


def _ascii_seconds(value: Any) -> Any:
    """``wait`` as the long-poll reads it (``approvals.api.longpoll.WAIT_DIGITS``): pydantic
    alone would take ``"1\u3000"`` or ``" 1"`` (it strips any Unicode space) and ``"1_0"``,
    which the long-poll does not read, so the view would wait in a thread instead."""
    if isinstance(value, str) and not longpoll.WAIT_DIGITS.fullmatch(value):
        raise PydanticCustomError(
            "int_parsing", "Input should be a whole number of seconds in the ASCII digits 0-9"
        )
    return value


class WaitQuery(Schema):
    wait: Annotated[int, BeforeValidator(_ascii_seconds)] = Field(
        0,
        ge=0,
        le=settings.LONG_POLL_MAX_SECONDS,
        description="Long-poll: seconds to wait for the occurrence to leave the state you "
        "have (the one named by `If-None-Match`, or else the one it is in now) before "
        "answering; 0 answers at once. Answers as soon as it changes (200 with the new "
        "state), or when the time is up with the state as it is then (304 when it still "
        "matches `If-None-Match`, else 200). It counts as one request against the key's "
        "rate limit, however long it waits.",
    )


@router.get(
    "/occurrences/{occurrence_id}",
    # A reviewer's tool reads it too, to see the digest it approves.
    auth=[RuntimeKeyAuth(), ReviewerTokenAuth()],
    response={
        200: OccurrenceOut,
        304: None,
        **AUTH_ERRORS,
        403: ErrorOut,
        404: ErrorOut,
        422: ErrorOut,
    },
    summary="An occurrence: what was proposed, approved, claimed and executed",
    description="The current proposal (canonical action, parsed arguments, digest, version, "
    "who edited it), the approval's state, the latest command with its effect, every "
    "command and epoch: enough for a runtime to compare before picking up a token and to "
    "resume after a crash. The answer carries an `ETag`; a poller that sends it back in "
    "`If-None-Match` gets `304 Not Modified` with no body while nothing changed. With "
    "`?wait=N` the request waits up to N seconds for a change (long-poll) instead of "
    "polling: a decision answers it as its transaction commits. A reviewer's access token "
    "whose owner is no longer a reviewer of its tenant is refused (403 `forbidden`), also "
    "in the middle of a wait.",
)
def occurrence_detail(
    request: HttpRequest, occurrence_id: str, response: HttpResponse, query: Query[WaitQuery]
) -> dict[str, Any] | HttpResponse:
    out, etag = _occurrence_state(request, occurrence_id)
    client_etags = parse_etags(request.headers.get("If-None-Match", ""))
    if query.wait and (not client_etags or etag in client_etags):
        # Served under ASGI, approvals.longpoll answers ?wait= without reaching this view.
        # Here (WSGI: runserver, the test client) the thread waits, reading at intervals.
        out, etag = _wait_in_thread(request, occurrence_id, etag, query.wait)
    if etag in client_etags:
        not_modified = HttpResponse(status=304)
        not_modified["ETag"] = etag
        return not_modified
    response["ETag"] = etag
    return out


def _occurrence_state(request: HttpRequest, occurrence_id: str) -> tuple[dict[str, Any], str]:
    out = _occurrence_out(_get_occurrence(request, occurrence_id))
    etag = quote_etag(
        hashlib.sha256(json.dumps(out, sort_keys=True, default=str).encode()).hexdigest()[:32]
    )
    return out, etag


def _wait_in_thread(
    request: HttpRequest, occurrence_id: str, etag: str, wait: int
) -> tuple[dict[str, Any], str]:
    deadline = time.monotonic() + wait
    caller = request.auth  # type: ignore[attr-defined]
    while True:
        time.sleep(max(0.0, min(settings.LONG_POLL_FALLBACK_SECONDS, deadline - time.monotonic())))
        if isinstance(caller, ReviewerToken):
            # Revoked, or its owner left the tenant, while it waited: refused as under ASGI,
            # where every read authenticates again.
            fresh = reviewer_tokens.reviewer_token_recheck(caller)
            if fresh is None:
                raise AuthenticationError
            request.auth = caller = fresh  # type: ignore[attr-defined]
        out, now = _occurrence_state(request, occurrence_id)
        if now != etag or time.monotonic() >= deadline:
            return out, now


class DecisionIn(StrictSchema):
    model_config = ConfigDict(extra="forbid", json_schema_extra=openapi.decision_in_schema)

    decision: Literal["approve", "reject"]
    seen_digest: StrictStr | None = Field(
        None,
        pattern="^[0-9a-f]{64}$",
        description="approve: the SHA-256 of the canonical action you reviewed (the "
        "occurrence's `proposal.action_digest`); a newer version is refused as stale_digest.",
    )
    reason: StrictStr | None = Field(
        None, max_length=2000, description="reject: why; the runtime is told."
    )


class DecisionOut(Schema):
    decision: Literal["approve", "reject"]
    outcome: ReviewOutcomeLiteral = Field(
        ...,
        description="issued: the approval is issued; vote_recorded: your vote counts toward a "
        "quorum that needs more reviewers; rejected: the request is rejected.",
    )
    votes: int | None
    needed: int | None
    occurrence: OccurrenceOut


@router.post(
    "/occurrences/{occurrence_id}/decisions",
    auth=ReviewerTokenAuth(),
    response={
        200: DecisionOut,
        **AUTH_ERRORS,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        **BODY_ERRORS,
    },
    summary="A reviewer approves or rejects, with a personal access token",
    description="For reviewers' tools and tests: `Authorization: Bearer pat_…` (a reviewer's "
    "personal access token, created on the console's Access tokens page), not a runtime "
    "key. The page's rules hold: the token's owner must be a reviewer of the tenant "
    "(403 forbidden), may not approve their own request or their own edit (403 "
    "self_approval), must send the digest of the current version (409 stale_digest), and a "
    "quorum counts distinct reviewers (`outcome: vote_recorded` until it is reached). "
    "Anything no longer pending is 409 with its status.",
)
def occurrence_decide(
    request: HttpRequest, occurrence_id: str, payload: DecisionIn
) -> dict[str, Any]:
    token: ReviewerToken = request.auth  # type: ignore[attr-defined]
    occurrence = _get_occurrence(request, occurrence_id)
    via = reviewer_tokens.via(token)
    votes: int | None = None
    needed: int | None = None
    if payload.decision == "approve":
        if payload.seen_digest is None:
            raise InputError(
                "missing_field",
                "seen_digest: send the digest of the version you reviewed.",
                "seen_digest",
            )
        approved = occurrence_approve(
            occurrence=occurrence, reviewer=token.user, seen_digest=payload.seen_digest, via=via
        )
        outcome = ReviewOutcome.ISSUED if approved.issued else ReviewOutcome.VOTE_RECORDED
        votes, needed = approved.votes, approved.needed
    else:
        occurrence_reject(
            occurrence=occurrence, reviewer=token.user, reason=payload.reason or "", via=via
        )
        outcome = ReviewOutcome.REJECTED
    return {
        "decision": payload.decision,
        "outcome": outcome,
        "votes": votes,
        "needed": needed,
        "occurrence": _occurrence_out(_get_occurrence(request, occurrence_id)),
    }


class LookupQuery(Schema):
    run_id: str = Field(..., min_length=1, max_length=200, pattern=openapi.NO_NUL)
    client_ref: str = Field(..., min_length=1, max_length=200, pattern=openapi.NO_NUL)


@router.get(
    "/occurrences",
    response={200: OccurrenceOut, **AUTH_ERRORS, 404: ErrorOut, 422: ErrorOut},
    summary="Find the occurrence a run proposed with a client_ref, creating nothing",
    description="What a runtime asks after a restart: the occurrence of this run and "
    "`client_ref` (the same body as `GET /api/v1/occurrences/{occurrence_id}`), or 404.",
)
def occurrence_lookup(request: HttpRequest, query: Query[LookupQuery]) -> dict[str, Any]:
    occurrence = occurrence_of_client_ref(
        tenant=runtime_key_of(request).tenant, run_id=query.run_id, client_ref=query.client_ref
    )
    if occurrence is None:
        raise Http404
    return _occurrence_out(occurrence)


@router.post(
    "/occurrences/{occurrence_id}/renew",
    response={200: OccurrenceOut, **AUTH_ERRORS, 404: ErrorOut, 409: ErrorOut},
    summary="Send an expired, unclaimed approval back to review",
    description="For a run that paused past its approval's expiry. The expired approval "
    "stays expired (on record, bound to its version); the occurrence gets a new proposal "
    "version with the same action and digest (`edited_by` null) and is `pending_review` "
    "again: a fresh review, whose votes are new. Audited as `occurrence.renewed`. Anything "
    "else is 409: `pending_review`, `not_expired`, `claimed`, `rejected` (with "
    "`details.reason`), `revoked`, `auto_admitted`.",
)
def occurrence_renew(request: HttpRequest, occurrence_id: str) -> dict[str, Any]:
    key = runtime_key_of(request)
    occurrence = _get_occurrence(request, occurrence_id)
    renewal.occurrence_renew(occurrence=occurrence, actor=f"runtime:{key.name}")
    return _occurrence_out(_get_occurrence(request, occurrence_id))


@router.post(
    "/occurrences/{occurrence_id}/token",
    response={
        200: TokenOut,
        **AUTH_ERRORS,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        **BODY_ERRORS,
    },
)
def token_pickup(
    request: HttpRequest,
    occurrence_id: str,
    response: HttpResponse,
    payload: TokenIn | None = None,
) -> dict[str, Any]:
    """Hand out the approval's token. Only the key that proposed the request (or one of its
    runtime group) may: another key of the tenant gets 403 other_runtime_key.

    Without a body (or without `execution_id`), once: later calls get 409
    token_already_delivered. With `{"execution_id"}`, the first pickup binds the approval
    to that execution, which alone may claim it; while it is unclaimed, the same execution
    may ask again after a crash and gets a fresh token (`redelivered: true`; the previous
    token is void, and a claim with it is `replayed`, reason `token_redelivered`). Another
    execution gets 409 token_already_delivered; an ask after the claim gets 409 claimed
    with `details.command_id` and `details.execution_id`."""
    key = runtime_key_of(request)
    pk = parse_uuid(occurrence_id)
    found = pickup_read(tenant_id=key.tenant_id, occurrence_id=pk) if pk is not None else None
    if found is None:
        raise Http404
    occurrence, approval = found
    delivered = approval_deliver(
        occurrence=occurrence,
        approval=approval,
        runtime_key=key,
        execution_id=(payload.execution_id or "") if payload is not None else "",
    )
    # The one answer that carries a raw token: no cache, proxy or browser may keep it
    # (NoStoreMiddleware says the same of every API answer; this one does not rely on it).
    add_never_cache_headers(response)
    return {
        "token": delivered.token,
        "fingerprint": delivered.approval.fingerprint,
        "expires_at": delivered.approval.expires_at,
        "execution_id": delivered.approval.bound_execution_id or None,
        "redelivered": delivered.redelivered,
    }
