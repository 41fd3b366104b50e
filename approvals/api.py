"""Agent API v1: JSON over HTTP, authenticated by a runtime key, scoped to its tenant.

Every error is ``{"error": {"code", "message", "details"?}}`` with a 4xx status: 400 for a
body that is not JSON at all, 413 above 64 KiB, 415 for another content type, 422 for JSON
that is refused (``details`` names each field). Bodies are parsed strictly (see
``approvals.canonical.parse_json``) before any row is written.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Literal

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    StreamingHttpResponse,
)
from django.urls import URLPattern, URLResolver
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_variables
from ninja import Field, NinjaAPI, Query, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer
from pydantic import ConfigDict, StrictStr

from approvals import selectors, services
from approvals.canonical import InputError, parse_json
from approvals.models import AuditEvent, Occurrence, RuntimeKey

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


def error_response(
    code: str, message: str, status: int, details: list[dict[str, Any]] | None = None
) -> HttpResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = details
    return HttpResponse(
        json.dumps({"error": error}), status=status, content_type="application/json"
    )


class RuntimeKeyAuth(HttpBearer):
    @method_decorator(sensitive_variables("token"))
    def authenticate(self, request: HttpRequest, token: str) -> RuntimeKey | None:
        return services.runtime_key_authenticate(token)


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
    def _get_urls(self) -> list[URLResolver | URLPattern]:
        urls = super()._get_urls()
        for pattern in urls:
            if isinstance(pattern, URLPattern):
                pattern.callback = _enveloped_405(pattern.callback)
        return urls


api = AgentAPI(
    title="Approval console agent API",
    version="1",
    urls_namespace="api-v1",
    parser=StrictJSONParser(),
    auth=RuntimeKeyAuth(),
    openapi_url="/openapi.json",
    docs_url="/docs",
)


@api.exception_handler(InputError)
def _input_error(request: HttpRequest, exc: InputError) -> HttpResponse:
    details = exc.details or ([{"field": exc.field, "code": exc.code}] if exc.field else None)
    status = _STATUS_FOR_CODE.get(exc.code, 422)
    return error_response(exc.code, exc.message, status, details)


@api.exception_handler(services.ServiceError)
def _service_error(request: HttpRequest, exc: services.ServiceError) -> HttpResponse:
    return error_response(exc.code, exc.message, exc.status)


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


def _key(request: HttpRequest) -> RuntimeKey:
    key: RuntimeKey = request.auth  # type: ignore[attr-defined]
    return key


# --- schemas -------------------------------------------------------------------------


class StrictSchema(Schema):
    model_config = ConfigDict(extra="forbid")


class ProposeIn(StrictSchema):
    tool: StrictStr = Field(..., min_length=1, max_length=100)
    arguments: dict[str, Any]
    run_id: StrictStr = Field(..., min_length=1, max_length=200)
    reason: StrictStr = Field(..., max_length=2000)
    requested_by: StrictStr | None = Field(None, max_length=150)
    client_ref: StrictStr | None = Field(None, min_length=1, max_length=200)


class ProposalOut(Schema):
    version: int
    action_digest: str
    canonical_action: str


class ProposeOut(Schema):
    occurrence_id: str
    status: str
    proposal: ProposalOut


class ApprovalOut(Schema):
    state: str
    fingerprint: str | None
    issued_at: datetime
    expires_at: datetime
    token_delivered: bool
    consumed_by_execution: str | None
    consumed_at: datetime | None


class CommandOut(Schema):
    id: str
    idempotency_key: str
    state: str
    execution_id: str


class EpochOut(Schema):
    number: int
    execution_id: str
    justification: str
    created_at: datetime


class OccurrenceOut(Schema):
    occurrence_id: str
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
    commands: list[CommandOut]
    epochs: list[EpochOut]


class TokenOut(Schema):
    token: str
    fingerprint: str
    expires_at: datetime


class ActionIn(StrictSchema):
    tool: StrictStr = Field(..., min_length=1, max_length=100)
    arguments: dict[str, Any]


class ClaimIn(StrictSchema):
    token: StrictStr = Field(..., min_length=1, max_length=200)
    action: ActionIn
    execution_id: StrictStr = Field(..., min_length=1, max_length=200)
    message_id: StrictStr | None = Field(None, max_length=200)


class ClaimOut(Schema):
    decision: Literal["approved", "duplicate_delivery"]
    command_id: str
    idempotency_key: str


class ClaimRefusedOut(Schema):
    decision: Literal["replayed", "scope_mismatch", "expired", "revoked", "unknown_token"]
    reason: str


class ErrorBody(Schema):
    code: str
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorOut(Schema):
    error: ErrorBody


class AuditQuery(Schema):
    after: int = Field(0, ge=0, le=2**63 - 1)
    limit: int | None = Field(None, ge=1, le=10_000)


# --- endpoints ---------------------------------------------------------------------------


def _proposal_out(occurrence: Occurrence) -> dict[str, Any]:
    proposal = selectors.current_proposal(occurrence)
    return {
        "version": proposal.version,
        "action_digest": proposal.action_digest,
        "canonical_action": proposal.canonical_action,
    }


@api.post(
    "/occurrences",
    response={200: ProposeOut, 201: ProposeOut, 409: ErrorOut, 422: ErrorOut},
    summary="Propose a tool call for review",
)
def propose(request: HttpRequest, payload: ProposeIn) -> Status[dict[str, Any]]:
    occurrence, created = services.occurrence_propose(
        runtime_key=_key(request),
        tool=payload.tool,
        arguments=payload.arguments,
        run_id=payload.run_id,
        reason=payload.reason,
        requested_by=payload.requested_by or "",
        client_ref=payload.client_ref or "",
    )
    occurrence = selectors.occurrence_detail_queryset().get(pk=occurrence.pk)
    body = {
        "occurrence_id": str(occurrence.pk),
        "status": occurrence.status,
        "proposal": _proposal_out(occurrence),
    }
    return Status(201 if created else 200, body)


def _get_occurrence(request: HttpRequest, occurrence_id: str) -> Occurrence:
    occurrence = selectors.occurrence_get_for_tenant(
        tenant=_key(request).tenant, occurrence_id=occurrence_id
    )
    if occurrence is None:
        raise Http404
    return occurrence


@api.get("/occurrences/{occurrence_id}", response={200: OccurrenceOut, 404: ErrorOut})
def occurrence_detail(request: HttpRequest, occurrence_id: str) -> dict[str, Any]:
    occurrence = _get_occurrence(request, occurrence_id)
    approval = selectors.current_approval(occurrence)
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
            "state": selectors.approval_state(approval),
            "fingerprint": approval.fingerprint or None,
            "issued_at": approval.issued_at,
            "expires_at": approval.expires_at,
            "token_delivered": approval.delivered_at is not None,
            "consumed_by_execution": approval.consumed_by_execution or None,
            "consumed_at": approval.consumed_at,
        },
        "commands": [
            {
                "id": str(c.id),
                "idempotency_key": c.idempotency_key,
                "state": c.state,
                "execution_id": c.execution_id,
            }
            for c in occurrence.commands.all()
        ],
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


@api.post(
    "/occurrences/{occurrence_id}/token", response={200: TokenOut, 404: ErrorOut, 409: ErrorOut}
)
def token_pickup(request: HttpRequest, occurrence_id: str) -> dict[str, Any]:
    """Hand out the approval's token once. Later calls get 409 token_already_delivered."""
    occurrence = _get_occurrence(request, occurrence_id)
    delivered = services.approval_deliver_token(occurrence=occurrence)
    return {
        "token": delivered.token,
        "fingerprint": delivered.approval.fingerprint,
        "expires_at": delivered.approval.expires_at,
    }


@api.post("/claims", response={200: ClaimOut, 403: ClaimRefusedOut, 422: ErrorOut})
def claim(request: HttpRequest, payload: ClaimIn) -> Status[dict[str, Any]]:
    result = services.approval_claim(
        tenant=_key(request).tenant,
        token=payload.token,
        tool=payload.action.tool,
        arguments=payload.action.arguments,
        execution_id=payload.execution_id,
        message_id=payload.message_id or "",
    )
    if result.command is not None:
        return Status(
            200,
            {
                "decision": result.decision,
                "command_id": str(result.command.id),
                "idempotency_key": result.command.idempotency_key,
            },
        )
    return Status(403, {"decision": result.decision, "reason": result.reason})


def _audit_line(event: AuditEvent) -> str:
    return (
        json.dumps(
            {
                "cursor": event.id,
                "event_id": str(event.event_id),
                "kind": event.kind,
                "occurrence_id": str(event.occurrence_id) if event.occurrence_id else None,
                "actor": event.actor,
                "token_fingerprint": event.token_fingerprint or None,
                "decision": event.decision or None,
                "reason_code": event.reason_code or None,
                "execution_id": event.execution_id or None,
                "message_id": event.message_id or None,
                "command_id": str(event.command_id) if event.command_id else None,
                "trace_id": event.trace_id or None,
                "source_time": event.source_time.isoformat(),
                "ingested_at": event.ingested_at.isoformat(),
                "data": event.data,
            },
            sort_keys=True,
        )
        + "\n"
    )


@api.get("/audit/events", summary="The tenant's audit events after a cursor, as NDJSON")
def audit_events(request: HttpRequest, query: Query[AuditQuery]) -> StreamingHttpResponse:
    events = selectors.audit_events_after(tenant=_key(request).tenant, after=query.after)
    if query.limit is not None:
        events = itertools.islice(events, query.limit)
    lines: Iterator[str] = (_audit_line(e) for e in events)
    return StreamingHttpResponse(lines, content_type="application/x-ndjson")
