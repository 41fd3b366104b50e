"""Agent API v1: JSON over HTTP, authenticated by a runtime key, scoped to its tenant.

Every error is ``{"error": {"code", "message", "details"?}}`` with a 4xx status: 400 for a
body that is not JSON at all, 413 above 64 KiB, 415 for another content type, 422 for JSON
that is refused (``details`` names each field). Bodies are parsed strictly (see
``approvals.canonical.parse_json``) before any row is written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import structlog
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    StreamingHttpResponse,
)
from django.urls import URLPattern, URLResolver
from django.utils.cache import add_never_cache_headers
from django.utils.decorators import method_decorator
from django.utils.http import parse_etags, quote_etag
from django.views.decorators.debug import sensitive_variables
from ninja import Field, NinjaAPI, Query, Schema, Status
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError
from ninja.openapi.schema import OpenAPISchema
from ninja.parser import Parser
from ninja.security import HttpBearer
from ninja.throttling import BaseThrottle
from pydantic import ConfigDict, StrictBool, StrictStr, WithJsonSchema, field_validator

from approvals import longpoll, metrics, openapi, presenters
from approvals.access import ratelimit, reviewer_tokens, tokens
from approvals.access.runtime_keys import runtime_key_authenticate
from approvals.audit import ingest
from approvals.audit.chain import audit_chain_extend
from approvals.audit.export import AuditFilter, audit_cursor_latest, audit_export
from approvals.audit.ingest import AuditLine
from approvals.callbacks.registry import callback_register, callback_remove, summary
from approvals.canonical.parsing import parse_json
from approvals.claims.claim import approval_claim
from approvals.claims.delivery import approval_deliver_token
from approvals.errors import InputError, ServiceError
from approvals.models import (
    Command,
    Occurrence,
    ReviewerToken,
    RuntimeCallback,
    RuntimeKey,
    ToolContract,
)
from approvals.reviews import renewal
from approvals.reviews.decisions import occurrence_approve, occurrence_reject
from approvals.reviews.proposals import action_canonical, occurrence_propose, prior_rejections
from approvals.reviews.selectors import (
    approval_state,
    current_approval,
    current_proposal,
    occurrence_detail_queryset,
    occurrence_get_for_tenant,
)
from approvals.reviews.selectors import occurrence_lookup as occurrence_of_client_ref
from approvals.selectors import tool_contract, tool_contracts
from approvals.vocabulary import AdmittingDecision, ClaimDecision, RefusingDecision

# --- parsing and errors -----------------------------------------------------------------


class StrictJSONParser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        content_type = request.content_type or ""
        charset = (request.content_params or {}).get("charset", "utf-8").lower()
        if content_type != "application/json" or charset not in {"utf-8", "utf8"}:
            raise InputError(
                "unsupported_media_type", "Send the body as Content-Type: application/json."
            )
        return parse_json(request.body)


_STATUS_FOR_CODE = {
    "unsupported_media_type": 415,
    "payload_too_large": 413,
    "invalid_json": 400,
    "invalid_encoding": 400,
}


def error_body(
    code: str, message: str, details: list[dict[str, Any]] | dict[str, Any] | None = None
) -> dict[str, Any]:
    """The error envelope: ``details`` is always there (null when there is nothing more)."""
    return {"error": {"code": code, "message": message, "details": details or None}}


def error_response(
    code: str,
    message: str,
    status: int,
    details: list[dict[str, Any]] | dict[str, Any] | None = None,
) -> HttpResponse:
    return HttpResponse(
        json.dumps(error_body(code, message, details)),
        status=status,
        content_type="application/json",
    )


class RuntimeKeyAuth(HttpBearer):
    @method_decorator(sensitive_variables("token"))
    def authenticate(self, request: HttpRequest, token: str) -> RuntimeKey | None:
        return runtime_key_authenticate(token)


class ReviewerTokenAuth(HttpBearer):
    """A reviewer's personal access token (``approvals.reviewer_tokens``)."""

    @method_decorator(sensitive_variables("token"))
    def authenticate(self, request: HttpRequest, token: str) -> ReviewerToken | None:
        return reviewer_tokens.reviewer_token_authenticate(token)


class RuntimeKeyThrottle(BaseThrottle):
    """Requests per runtime key per window (``approvals.ratelimit``), run by ninja after
    authentication on every operation. ninja asks ``allow_request`` and then ``wait`` of
    one shared instance, so what the answer needs is kept per thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def allow_request(self, request: HttpRequest) -> bool:
        key = getattr(request, "auth", None)
        if not isinstance(key, RuntimeKey):
            return True
        if getattr(request, "scope", {}).get(longpoll.REREAD_SCOPE_KEY):
            # A long-poll's later reads (approvals.longpoll): its first read was counted.
            self._local.wait, self._local.limit = None, None
            return True
        admission = ratelimit.request_admit(key)
        self._local.wait = admission.retry_after
        self._local.limit = admission.limit
        return admission.allowed

    def wait(self) -> float | None:
        wait: int | None = getattr(self._local, "wait", None)
        return wait

    def limit(self) -> int | None:
        limit: int | None = getattr(self._local, "limit", None)
        return limit


def _enveloped_405(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """ninja answers a wrong method with a plain-text 405; give it the error envelope."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            allowed = response["Allow"]
            response = error_response(
                "method_not_allowed", f"{request.method} is not allowed here; use {allowed}.", 405
            )
            response["Allow"] = allowed
        return response

    return wrapper


class AgentAPI(NinjaAPI):
    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None
    ) -> OpenAPISchema:
        # ninja's document, plus what it cannot derive from the operations: response
        # headers, links between operations, UUID path parameters (approvals.openapi).
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        openapi.complete(schema)
        return schema

    def _get_urls(self) -> list[URLResolver | URLPattern]:
        urls = super()._get_urls()
        for pattern in urls:
            if isinstance(pattern, URLPattern):
                pattern.callback = _enveloped_405(pattern.callback)
        return urls


_log = structlog.get_logger("approvals.api")
_throttle = RuntimeKeyThrottle()

api = AgentAPI(
    title="Approval console agent API",
    version="1",
    description=openapi.API_DESCRIPTION,
    urls_namespace="api-v1",
    parser=StrictJSONParser(),
    auth=RuntimeKeyAuth(),
    # Every operation, after authentication: requests per runtime key per window.
    throttle=_throttle,
    openapi_url="/openapi.json",
    docs_url="/docs",
)


@api.exception_handler(InputError)
def _input_error(request: HttpRequest, exc: InputError) -> HttpResponse:
    details = exc.details or ([{"field": exc.field, "code": exc.code}] if exc.field else None)
    status = _STATUS_FOR_CODE.get(exc.code, 422)
    return error_response(exc.code, exc.message, status, details)


@api.exception_handler(ServiceError)
def _service_error(request: HttpRequest, exc: ServiceError) -> HttpResponse:
    response = error_response(exc.code, exc.message, exc.status, exc.details)
    if exc.code in _RETRY_AFTER_SECONDS:
        response["Retry-After"] = str(_RETRY_AFTER_SECONDS[exc.code])
    return response


# Refusals that waiting may lift (a review still to come): seconds before asking again.
_RETRY_AFTER_SECONDS = {"not_approved": 5}


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja wraps parser failures in a 400; unwrap them to keep their precise code.
    if isinstance(exc.__cause__, InputError):
        return _input_error(request, exc.__cause__)
    return error_response("bad_request", str(exc), exc.status_code)


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    limit = settings.API_MAX_BODY_BYTES // 1024
    return error_response("payload_too_large", f"The body is larger than {limit} KiB.", 413)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = error_response(
        "unauthenticated", "Send a valid, active runtime key as 'Authorization: Bearer <key>'.", 401
    )
    response["WWW-Authenticate"] = 'Bearer realm="agent-api"'
    return response


@api.exception_handler(Throttled)
def _rate_limited(request: HttpRequest, exc: Throttled) -> HttpResponse:
    retry_after = int(exc.wait or 1)
    limit = _throttle.limit()
    window = settings.API_RATE_WINDOW_SECONDS
    response = error_response(
        "rate_limited",
        f"This runtime key made more than {limit} requests in {window} seconds; "
        f"retry after {retry_after} seconds.",
        429,
    )
    response["Retry-After"] = str(retry_after)
    return response


def database_unavailable_response() -> HttpResponse:
    """``503 database_unavailable`` with ``Retry-After``: nothing was written (every change
    is one transaction, which the database rolls back when it goes away)."""
    response = error_response(
        "database_unavailable",
        "The console's database is unavailable; nothing was changed. Retry later.",
        503,
    )
    response["Retry-After"] = str(settings.DATABASE_RETRY_AFTER_SECONDS)
    return response


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def _database_unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    # Logged with its traceback and the request's trace id (bound by TraceIdMiddleware),
    # as Django logs the errors it handles itself.
    _log.error("database_unavailable", path=request.path, exc_info=exc)
    return database_unavailable_response()


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error_response("not_found", "No such resource for this runtime key's tenant.", 404)


_VALIDATION_CODES = {
    "missing": "missing_field",
    "extra_forbidden": "unknown_field",
    "string_type": "wrong_type",
    "dict_type": "wrong_type",
    "model_type": "wrong_type",
    "model_attributes_type": "wrong_type",
    "int_type": "wrong_type",
    "int_parsing": "wrong_type",
    "string_too_short": "too_short",
    "string_too_long": "too_long",
    "greater_than_equal": "out_of_range",
    "less_than_equal": "out_of_range",
}


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    if any(
        e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body", "payload")
        for e in exc.errors
    ):
        # ninja skips the parser for an empty body and reports the whole payload missing.
        return error_response("empty_body", "The body is empty; send a JSON object.", 400)
    details = []
    for error in exc.errors:
        loc = [
            str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path", "payload")
        ]
        details.append(
            {
                "field": ".".join(loc) or "body",
                "code": _VALIDATION_CODES.get(error.get("type", ""), "invalid_field"),
                "message": error.get("msg", ""),
            }
        )
    first = details[0] if details else {"field": "body", "code": "invalid_body", "message": ""}
    message = f"{first['field']}: {first['message']}" if first["message"] else "Invalid request."
    return error_response(first["code"], message, 422, details)


def runtime_key_of(request: HttpRequest) -> RuntimeKey:
    """The runtime key that authenticated the request."""
    key: RuntimeKey = request.auth  # type: ignore[attr-defined]
    return key


# --- schemas -------------------------------------------------------------------------


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
    decision: Literal["rejected"]
    reason: str
    decided_at: datetime | None
    decided_by: str = Field(..., description="The reviewer, or `policy` (a repeat rejected).")


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
        "were rejected, with their reasons, newest first: a model retrying a rejected call "
        "should be told, not proposed again.",
    )


class ApprovalOut(Schema):
    state: str
    fingerprint: str | None
    issued_at: datetime
    expires_at: datetime
    token_delivered: bool
    consumed_by_execution: str | None
    consumed_at: datetime | None


# The effect vocabulary of DESIGN.md, as the API names it (``Command.effect_state``).
EffectState = Literal[
    "not_sent", "sending", "committed", "rejected", "outcome_unknown", "reconciled", "compensated"
]
ExecutedBy = Literal["console", "runtime"]


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
    status: str
    tool: str
    run_id: str
    reason: str
    requested_by: str
    client_ref: str
    rejection_reason: str
    admission_justification: str
    created_at: datetime
    proposal: ProposalOut
    approval: ApprovalOut | None
    command: CommandOut | None = Field(
        ..., description="The latest command (the last of `commands`), with its effect."
    )
    commands: list[CommandOut]
    epochs: list[EpochOut]


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


class ErrorBody(Schema):
    code: str
    message: str
    details: list[dict[str, Any]] | dict[str, Any] | None = Field(
        ...,
        description="A list of `{field, code, message}` for a refused request body or query; "
        "an object with the refusal's facts for a refused state change (a rejection's "
        "`reason`); null when there is nothing more.",
    )


class ErrorOut(Schema):
    error: ErrorBody


class ClaimRefusedOut(Schema):
    decision: RefusingDecision
    reason: str
    error: ErrorBody = Field(
        ..., description="The same refusal in the API's error envelope (`code` = `decision`)."
    )


class AuditQuery(Schema):
    after: int = Field(
        0, ge=0, le=2**63 - 1, description="A cursor: the `cursor` of the last event read."
    )
    limit: int | None = Field(None, ge=1, le=10_000)
    kind: str | None = Field(
        None,
        min_length=1,
        max_length=65,
        pattern=r"^[A-Za-z0-9_.:-]+\*?$",
        description="An event kind (`claim.approved`), or a prefix ending in `*` (`claim.*`).",
    )
    occurrence: uuid.UUID | None = Field(None, description="Only this occurrence's events.")
    fingerprint: str | None = Field(
        None,
        min_length=1,
        max_length=16,
        pattern=openapi.NO_NUL,
        description="Only events of this token fingerprint.",
    )
    execution: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=openapi.NO_NUL,
        description="Only events of this execution id.",
    )
    since: Annotated[datetime, WithJsonSchema(openapi.SINCE)] | None = Field(
        None,
        description="Only events whose source time is at or after this: an ISO 8601 date, "
        "or date and time (UTC when it has no offset).",
    )

    @field_validator("since", mode="before")
    @classmethod
    def _since_is_iso_8601(cls, value: Any) -> Any:
        # pydantic would also read a number as a Unix time; the filter is ISO 8601 only.
        if isinstance(value, str) and not openapi.ISO_DATE_PREFIX.match(value):
            raise ValueError("since is not an ISO 8601 date or date and time.")
        return value


class AuditCursorOut(Schema):
    cursor: int


class AuditEventLineOut(Schema):
    """One line of the audit export (``selectors.audit_event_line``)."""

    cursor: int = Field(..., description="Pass the last line's as `after` for the next page.")
    event_id: str = Field(..., json_schema_extra=openapi.UUID)
    kind: str
    occurrence_id: str | None = Field(..., json_schema_extra=openapi.UUID)
    actor: str
    token_fingerprint: str | None
    decision: str | None
    reason_code: str | None
    execution_id: str | None
    message_id: str | None
    command_id: str | None = Field(..., json_schema_extra=openapi.UUID)
    trace_id: str | None
    source_time: datetime
    ingested_at: datetime
    data: dict[str, Any]
    ingestion_id: int | None
    chain_seq: int | None
    hash: str | None
    prev_hash: str | None


class AuditIngestOut(Schema):
    received: int = Field(..., description="Lines in the batch.")
    new: int = Field(..., description="Producer events stored now.")
    duplicates: int = Field(
        ..., description="Lines whose producer event id was stored before: not stored again."
    )
    ingestion_id: int


# --- endpoints ---------------------------------------------------------------------------


def _proposal_out(occurrence: Occurrence) -> dict[str, Any]:
    proposal = current_proposal(occurrence)
    return {
        "version": proposal.version,
        "action_digest": proposal.action_digest,
        "canonical_action": proposal.canonical_action,
        "arguments": proposal.arguments,
        "edited_by": proposal.edited_by.get_username() if proposal.edited_by else None,
    }


def _prior_decisions_out(occurrence: Occurrence) -> list[dict[str, Any]]:
    """Rejected occurrences of the run with the action the runtime proposed (version 1)."""
    proposed = min(occurrence.proposals.all(), key=lambda p: p.version)
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
        )
    ]


# Statuses every operation may answer besides its own: the key (401), its request budget
# (429) and the database (503); a JSON body's envelope (400, 413, 415, 422). The drift test
# (tests/api/test_schema.py) checks that every operation lists them.
AUTH_ERRORS: dict[int, type[Schema]] = {401: ErrorOut, 429: ErrorOut, 503: ErrorOut}
BODY_ERRORS: dict[int, type[Schema]] = {400: ErrorOut, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut}
_AUTH_ERRORS, _BODY_ERRORS = AUTH_ERRORS, BODY_ERRORS


@api.post(
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
    occurrence, created = occurrence_propose(
        runtime_key=runtime_key_of(request),
        tool=payload.tool,
        arguments=payload.arguments,
        run_id=payload.run_id,
        reason=payload.reason,
        requested_by=payload.requested_by or "",
        client_ref=payload.client_ref or "",
    )
    occurrence = occurrence_detail_queryset().get(pk=occurrence.pk)
    metrics.proposal_received(occurrence, created)
    body = {
        "occurrence_id": str(occurrence.pk),
        "status": occurrence.status,
        "proposal": _proposal_out(occurrence),
        "rejection_reason": occurrence.rejection_reason,
        "prior_decisions": _prior_decisions_out(occurrence),
    }
    return Status(201 if created else 200, body)


def _get_occurrence(request: HttpRequest, occurrence_id: str) -> Occurrence:
    # The caller's tenant: a runtime key's, or a reviewer token's (GET and decisions).
    caller: RuntimeKey | ReviewerToken = request.auth  # type: ignore[attr-defined]
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
    """An occurrence read with ``selectors.occurrence_detail_queryset``, as the API shows it."""
    approval = current_approval(occurrence)
    commands = [_command_out(c) for c in occurrence.commands.all()]
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
        "epochs": [
            {
                "number": e.number,
                "execution_id": e.execution_id,
                "justification": e.justification,
                "created_at": e.created_at,
            }
            for e in occurrence.epochs.all()
        ],
    }


class WaitQuery(Schema):
    wait: int = Field(
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


@api.get(
    "/occurrences/{occurrence_id}",
    # A reviewer's tool reads it too, to see the digest it approves.
    auth=[RuntimeKeyAuth(), ReviewerTokenAuth()],
    response={200: OccurrenceOut, 304: None, **_AUTH_ERRORS, 404: ErrorOut, 422: ErrorOut},
    summary="An occurrence: what was proposed, approved, claimed and executed",
    description="The current proposal (canonical action, parsed arguments, digest, version, "
    "who edited it), the approval's state, the latest command with its effect, every "
    "command and epoch: enough for a runtime to compare before picking up a token and to "
    "resume after a crash. The answer carries an `ETag`; a poller that sends it back in "
    "`If-None-Match` gets `304 Not Modified` with no body while nothing changed. With "
    "`?wait=N` the request waits up to N seconds for a change (long-poll) instead of "
    "polling: a decision answers it as its transaction commits.",
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
    while True:
        time.sleep(max(0.0, min(settings.LONG_POLL_FALLBACK_SECONDS, deadline - time.monotonic())))
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
    outcome: Literal["issued", "vote_recorded", "rejected"] = Field(
        ...,
        description="issued: the approval is issued; vote_recorded: your vote counts toward a "
        "quorum that needs more reviewers; rejected: the request is rejected.",
    )
    votes: int | None
    needed: int | None
    occurrence: OccurrenceOut


@api.post(
    "/occurrences/{occurrence_id}/decisions",
    auth=ReviewerTokenAuth(),
    response={
        200: DecisionOut,
        **_AUTH_ERRORS,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        **_BODY_ERRORS,
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
        outcome = "issued" if approved.issued else "vote_recorded"
        votes, needed = approved.votes, approved.needed
    else:
        occurrence_reject(
            occurrence=occurrence, reviewer=token.user, reason=payload.reason or "", via=via
        )
        outcome = "rejected"
    return {
        "decision": payload.decision,
        "outcome": outcome,
        "votes": votes,
        "needed": needed,
        "occurrence": _occurrence_out(_get_occurrence(request, occurrence_id)),
    }


class CallbackIn(StrictSchema):
    url: StrictStr = Field(
        ...,
        min_length=1,
        max_length=2000,
        # Documented, not enforced here: the service names what is wrong (invalid_url,
        # https_required, private_host) where a pattern would say only invalid_field.
        json_schema_extra={"pattern": openapi.CALLBACK_URL},
        description="Where each decision on this key's requests is POSTed (https). 422 "
        "`invalid_url` for another scheme, spaces or control characters, or credentials "
        "in it, `https_required` for http unless the console "
        "allows it, `private_host` for a loopback or private address.",
        examples=["https://agents.example.com/console-callback"],
    )
    rotate_secret: StrictBool = Field(
        False, description="Mint a new signing secret (the answer shows it once)."
    )


class CallbackOut(Schema):
    url: str
    active: bool
    secret: str | None = Field(
        None,
        description="The signing secret, shown only when the callback is first registered "
        "or its secret rotated; keep it: the console never shows it again.",
    )
    deliveries: dict[str, int] = Field(..., description="This callback's deliveries by state.")


def _callback_out(callback: Any, secret: str = "") -> dict[str, Any]:
    return {
        "url": callback.url,
        "active": callback.is_active,
        "secret": secret or None,
        "deliveries": summary(callback),
    }


@api.put(
    "/callback",
    response={200: CallbackOut, **_AUTH_ERRORS, **_BODY_ERRORS},
    summary="Register this runtime key's callback URL: decisions are pushed to it",
    description="Each decision on a request this key proposed (`approved`, `rejected`, "
    "`expired`, `edited`) is POSTed to the URL as JSON, signed: `X-Console-Signature: "
    'sha256=HMAC-SHA256(secret, "<X-Console-Timestamp>.<body>")`, with '
    "`X-Console-Delivery` the same on every retry. Retried with backoff until a 2xx. The "
    "first registration (or `rotate_secret`) answers the secret, once.",
)
def callback_put(request: HttpRequest, payload: CallbackIn) -> dict[str, Any]:
    registered = callback_register(
        runtime_key=runtime_key_of(request), url=payload.url, rotate=payload.rotate_secret
    )
    return _callback_out(registered.callback, registered.secret)


@api.get(
    "/callback",
    response={200: CallbackOut, **_AUTH_ERRORS, 404: ErrorOut},
    summary="This runtime key's callback, and its deliveries by state",
)
def callback_get(request: HttpRequest) -> dict[str, Any]:
    callback = RuntimeCallback.objects.filter(runtime_key=runtime_key_of(request)).first()
    if callback is None:
        raise Http404
    return _callback_out(callback)


@api.delete(
    "/callback",
    response={204: None, **_AUTH_ERRORS, 404: ErrorOut},
    summary="Stop pushing decisions to this runtime key's callback",
)
def callback_delete(request: HttpRequest) -> Status[None]:
    if not callback_remove(runtime_key=runtime_key_of(request)):
        raise Http404
    return Status(204, None)


class LookupQuery(Schema):
    run_id: str = Field(..., min_length=1, max_length=200, pattern=openapi.NO_NUL)
    client_ref: str = Field(..., min_length=1, max_length=200, pattern=openapi.NO_NUL)


@api.get(
    "/occurrences",
    response={200: OccurrenceOut, **_AUTH_ERRORS, 404: ErrorOut, 422: ErrorOut},
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


@api.post(
    "/occurrences/{occurrence_id}/renew",
    response={200: OccurrenceOut, **_AUTH_ERRORS, 404: ErrorOut, 409: ErrorOut},
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


@api.post(
    "/occurrences/{occurrence_id}/token",
    response={
        200: TokenOut,
        **_AUTH_ERRORS,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        **_BODY_ERRORS,
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
    occurrence = _get_occurrence(request, occurrence_id)
    delivered = approval_deliver_token(
        occurrence=occurrence,
        runtime_key=runtime_key_of(request),
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


@api.post(
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
)
def claim(request: HttpRequest, payload: ClaimIn) -> Status[dict[str, Any]]:
    result = approval_claim(
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


# --- tool contracts ----------------------------------------------------------------------


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
    reject_repeats: bool = Field(
        ...,
        description="A proposal repeating an action rejected earlier in its run is rejected "
        "without a review, with the original reason.",
    )
    approvals_needed: ApprovalsNeededOut


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
        description="With `run_id`: the run's rejected occurrences of this action, newest "
        "first (as a proposal's answer lists them). Empty without `run_id`.",
    )


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
        "reject_repeats": contract.reject_repeats,
        "approvals_needed": {
            "rule": presenters.quorum_rule(contract),
            "approvals_required": contract.approvals_required,
            "quorum_amount_argument": contract.quorum_amount_argument or None,
            "quorum_currency_argument": contract.quorum_currency_argument or None,
            "quorum_thresholds_minor": contract.quorum_thresholds_minor or {},
            "quorum_threshold_minor": contract.quorum_threshold_minor,
        },
    }


@api.get(
    "/tools",
    response={200: ToolsOut, **_AUTH_ERRORS},
    summary="Every tool contract",
    tags=["contracts"],
)
def tools(request: HttpRequest) -> dict[str, Any]:
    return {"tools": [_tool_out(c) for c in tool_contracts()]}


@api.get(
    "/tools/{name}",
    response={200: ToolOut, **_AUTH_ERRORS, 404: ErrorOut},
    summary="One tool contract: its arguments' JSON Schema, replay safety, approvals needed",
    tags=["contracts"],
)
def tool_detail(request: HttpRequest, name: str) -> dict[str, Any]:
    # No contract's name holds a NUL character, which PostgreSQL text cannot even compare.
    contract = tool_contract(name) if "\x00" not in name else None
    if contract is None:
        raise Http404
    return _tool_out(contract)


@api.post(
    "/actions/canonicalize",
    response={200: CanonicalOut, **_AUTH_ERRORS, **_BODY_ERRORS},
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


# --- the audit trail ---------------------------------------------------------------------

# Events an export chains before it answers; a larger backlog is the beat task's, and the
# export serves what is chained (the next request continues from its last cursor).
AUDIT_EXPORT_CHAIN_LIMIT = 10_000


@api.get(
    "/audit/events",
    # 200 is NDJSON, not JSON: its media type and line schema are in openapi_extra.
    response={200: None, **AUTH_ERRORS, 422: ErrorOut},
    summary="The tenant's audit events after a cursor, as NDJSON",
    description="One JSON object per line, in cursor order. Pass the last line's `cursor` "
    "as `after` for the next page: no event is skipped or repeated across pages, even while "
    "events are being written, because only events below every still-open writer's ids are "
    "served. Every event served is hash-chained (`chain_seq`, `hash`, `prev_hash`). A "
    "malformed filter is 422.",
    openapi_extra={
        "responses": {
            200: {
                "description": "`application/x-ndjson`: one event per line, each an object "
                "of this schema.",
                "content": {
                    "application/x-ndjson": {"schema": AuditEventLineOut.model_json_schema()}
                },
            }
        }
    },
)
def audit_events(request: HttpRequest, query: Query[AuditQuery]) -> StreamingHttpResponse:
    tenant = runtime_key_of(request).tenant
    through = audit_chain_extend(tenant_id=tenant.pk, limit=AUDIT_EXPORT_CHAIN_LIMIT)
    since = query.since
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    try:
        # In UTC: PostgreSQL refuses offsets beyond ±15:59 that ISO 8601 allows.
        since = since.astimezone(UTC) if since is not None else None
    except OverflowError:
        raise InputError(
            "out_of_range", "since: the time is outside the years 1 to 9999 in UTC.", "since"
        ) from None
    filters = AuditFilter(
        kind=query.kind,
        occurrence_id=query.occurrence,
        fingerprint=query.fingerprint,
        execution_id=query.execution,
        since=since,
    )
    chunks = audit_export(
        tenant=tenant, after=query.after, through=through, filters=filters, limit=query.limit
    )
    return StreamingHttpResponse(chunks, content_type="application/x-ndjson")


@api.get(
    "/audit/events/cursor",
    response={200: AuditCursorOut, **AUTH_ERRORS},
    summary="The newest cursor: start reading from now on without reading from 0",
)
def audit_events_cursor(request: HttpRequest) -> dict[str, int]:
    return {"cursor": audit_cursor_latest(tenant=runtime_key_of(request).tenant)}


# A batch may be larger than the API's other bodies; the limit is checked on the
# Content-Length before anything is read.
AUDIT_INGEST_MAX_BODY_BYTES = 1024 * 1024
# Refusals listed in one answer; a batch with more bad lines names the first ones.
_AUDIT_INGEST_MAX_DETAILS = 100

_AUDIT_KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_FINGERPRINT = re.compile(r"^[A-Za-z0-9_-]{1,16}$")
# A raw approval token or runtime key: never stored in the audit trail (a token's
# fingerprint is what names it there).
_RAW_TOKEN = re.compile(
    f"(?:{re.escape(tokens.APPROVAL_TOKEN_PREFIX)}|{re.escape(tokens.RUNTIME_KEY_PREFIX)})"
    r"[A-Za-z0-9_-]{16,}"
)

# field: (required, longest string); the values are checked by _audit_field.
_AUDIT_LINE_FIELDS: dict[str, tuple[bool, int]] = {
    "event_id": (True, 36),
    "kind": (True, 64),
    "fingerprint": (True, 16),
    "decision": (True, 32),
    "execution_id": (True, 200),
    "message_id": (True, 200),
    "command_id": (True, 36),
    "source_time": (True, 40),
    "reason_code": (False, 64),
    "occurrence_id": (False, 36),
}
# Fields that may be null (or "") when the event has no such thing.
_AUDIT_NULLABLE = {
    "fingerprint",
    "decision",
    "execution_id",
    "message_id",
    "command_id",
    "reason_code",
    "occurrence_id",
}


def _audit_batch_schema() -> dict[str, Any]:
    """The JSON Schema of an ingest batch's lines, from the rules ``_audit_field`` applies."""
    properties: dict[str, Any] = {}
    for name, (_, longest) in _AUDIT_LINE_FIELDS.items():
        text: dict[str, Any] = {"type": "string", "maxLength": longest, "pattern": openapi.NO_NUL}
        if name in {"event_id", "command_id", "occurrence_id"}:
            text = {"type": "string", **openapi.UUID}
        elif name == "source_time":
            text = {"type": "string", "format": "date-time", "maxLength": longest}
        elif name == "kind":
            text = {"type": "string", "pattern": _AUDIT_KIND.pattern}
        elif name == "fingerprint":
            text = {"type": "string", "pattern": _FINGERPRINT.pattern}
        if name in _AUDIT_NULLABLE:
            # "" is read as null too.
            properties[name] = {"anyOf": [text, {"type": "null"}, {"const": ""}]}
        else:
            properties[name] = text
    line = {
        "type": "object",
        "properties": properties,
        "required": [name for name, (required, _) in _AUDIT_LINE_FIELDS.items() if required],
        "additionalProperties": False,
    }
    return {"type": "array", "minItems": 1, "items": line}


# An event's time, in UTC, is refused before this and more than SOURCE_TIME_AHEAD after now
# (a producer's clock may run a little fast). This also keeps out what Python cannot hold
# (0001-01-01T00:00:00+14:00 is year 0 in UTC): PostgreSQL would store it, and every read
# of the append-only row would fail.
SOURCE_TIME_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
SOURCE_TIME_AHEAD = timedelta(days=1)


def _plausible_source_time(moment: datetime) -> bool:
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:
        return False
    return SOURCE_TIME_EARLIEST <= utc <= datetime.now(UTC) + SOURCE_TIME_AHEAD


class _LineRefused(Exception):
    def __init__(self, field: str, code: str, message: str) -> None:
        super().__init__(message)
        self.detail = {"field": field, "code": code, "message": message}


def _audit_field(name: str, value: Any) -> Any:
    """The field's value as stored ("" for an absent text), or _LineRefused."""
    if value is None or value == "":
        if name not in _AUDIT_NULLABLE:
            raise _LineRefused(name, "missing_field", f"{name} is required.")
        return None if name in {"command_id", "occurrence_id"} else ""
    if not isinstance(value, str):
        raise _LineRefused(name, "wrong_type", f"{name} must be a string.")
    longest = _AUDIT_LINE_FIELDS[name][1]
    if len(value) > longest:
        raise _LineRefused(name, "too_long", f"{name} is longer than {longest} characters.")
    if _RAW_TOKEN.search(value):
        raise _LineRefused(
            name, "raw_token", f"{name} holds a raw token or key; send a token's fingerprint."
        )
    if name in {"event_id", "command_id", "occurrence_id"}:
        try:
            return uuid.UUID(value)
        except ValueError:
            raise _LineRefused(name, "invalid_uuid", f"{name} is not a UUID.") from None
    if name == "source_time":
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise _LineRefused(
                name, "invalid_time", "source_time is not an ISO 8601 date and time."
            ) from None
        if moment.tzinfo is None:
            raise _LineRefused(
                name, "invalid_time", "source_time needs a UTC offset (Z or +hh:mm)."
            )
        if not _plausible_source_time(moment):
            raise _LineRefused(
                name,
                "time_out_of_range",
                "source_time must fall between 2000-01-01T00:00:00Z and a day from now.",
            )
        return moment
    if name == "kind" and not _AUDIT_KIND.match(value):
        raise _LineRefused(
            name, "invalid_kind", "kind is letters, digits and _ . : - (64 at most)."
        )
    if name == "fingerprint" and not _FINGERPRINT.match(value):
        raise _LineRefused(name, "invalid_fingerprint", "fingerprint is not a fingerprint.")
    return value


def _audit_line_in(number: int, raw: bytes) -> AuditLine:
    try:
        payload = parse_json(raw)
    except InputError as exc:
        raise _LineRefused(exc.field or "line", exc.code, exc.message) from None
    if not isinstance(payload, dict):
        raise _LineRefused("line", "wrong_type", "Each line must be a JSON object.")
    unknown = sorted(set(payload) - set(_AUDIT_LINE_FIELDS))
    if unknown:
        raise _LineRefused(unknown[0], "unknown_field", f"{unknown[0]} is not a known field.")
    for name, (required, _) in _AUDIT_LINE_FIELDS.items():
        if required and name not in payload:
            raise _LineRefused(name, "missing_field", f"{name} is missing.")
    values = {name: _audit_field(name, payload.get(name)) for name in _AUDIT_LINE_FIELDS}
    return AuditLine(
        line=number,
        event_id=values["event_id"],
        kind=values["kind"],
        token_fingerprint=values["fingerprint"],
        decision=values["decision"],
        execution_id=values["execution_id"],
        message_id=values["message_id"],
        command_id=values["command_id"],
        source_time=values["source_time"],
        reason_code=values["reason_code"],
        occurrence_id=values["occurrence_id"],
        payload=payload,
    )


def _ndjson_body(request: HttpRequest) -> bytes | HttpResponse:
    """The body, read here from the request's stream under this endpoint's own limit:
    ``request.body`` would apply the API's 64 KiB (``DATA_UPLOAD_MAX_MEMORY_SIZE``)."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length <= 0:
        return error_response(
            "empty_body", "The body is empty; send one JSON object per line.", 400
        )
    charset = (request.content_params or {}).get("charset", "utf-8").lower()
    if request.content_type != "application/x-ndjson" or charset not in {"utf-8", "utf8"}:
        return error_response(
            "unsupported_media_type",
            "Send the batch as Content-Type: application/x-ndjson, one JSON object per line.",
            415,
        )
    too_big = error_response(
        "payload_too_large",
        f"The body is larger than {AUDIT_INGEST_MAX_BODY_BYTES // 1024} KiB; send smaller batches.",
        413,
    )
    if length > AUDIT_INGEST_MAX_BODY_BYTES:
        return too_big
    raw = request.read(AUDIT_INGEST_MAX_BODY_BYTES + 1)
    return too_big if len(raw) > AUDIT_INGEST_MAX_BODY_BYTES else raw


@api.post(
    "/audit/events",
    response={200: AuditIngestOut, **AUTH_ERRORS, **BODY_ERRORS},
    summary="Ingest other producers' audit events (NDJSON)",
    description="One event per line: `event_id` (the producer's, a UUID), `kind`, "
    "`fingerprint`, `decision`, `execution_id`, `message_id`, `command_id`, `source_time` "
    "(ISO 8601 with an offset), and optionally `reason_code` and `occurrence_id`; the values "
    "an event does not have may be null. A producer event id stored before (by an earlier "
    "batch or an earlier line) is stored once and counted as a duplicate delivery. A bad "
    "line refuses the whole batch with 422, naming each bad line. At most 1 MiB. No value "
    "may hold a raw approval token or runtime key (`raw_token`); each line is strict JSON "
    "(no NUL character, integers within ±(2^53 - 1)); an `occurrence_id` must name an "
    "occurrence of the key's tenant (`unknown_occurrence`).",
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "NDJSON: the events one JSON object per line, without an enclosing "
            "array (the schema's array is the sequence of lines).",
            "content": {"application/x-ndjson": {"schema": _audit_batch_schema()}},
        }
    },
)
def audit_ingest(request: HttpRequest) -> HttpResponse | dict[str, int]:
    raw = _ndjson_body(request)
    if isinstance(raw, HttpResponse):
        return raw
    lines: list[AuditLine] = []
    refused: list[dict[str, Any]] = []
    for number, text in enumerate(raw.split(b"\n"), start=1):
        text = text.removesuffix(b"\r")
        if not text.strip():
            continue
        try:
            lines.append(_audit_line_in(number, text))
        except _LineRefused as exc:
            refused.append({"line": number, **exc.detail})
    if refused:
        first = refused[0]
        return error_response(
            first["code"],
            f"line {first['line']}: {first['message']} Nothing of the batch was stored.",
            422,
            refused[:_AUDIT_INGEST_MAX_DETAILS],
        )
    if not lines:
        return error_response(
            "empty_body", "The body is empty; send one JSON object per line.", 400
        )
    ingestion = ingest.audit_ingest(runtime_key=runtime_key_of(request), lines=lines)
    return {
        "received": ingestion.received,
        "new": ingestion.new,
        "duplicates": ingestion.duplicates,
        "ingestion_id": ingestion.pk,
    }
