"""The agent API's execution endpoints: a command's evidence, the effect a runtime reports
for a tool it executes itself, and a request for another epoch. Mounted on the v1 API in
``config.urls``; authentication, parsing and the error envelope are the API's."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import Http404, HttpRequest
from ninja import Field, Router, Schema, Status
from pydantic import StrictStr, StringConstraints

from approvals.api import openapi
from approvals.api.base import runtime_key_of
from approvals.api.errors import AUTH_ERRORS, BODY_ERRORS, ErrorOut
from approvals.api.schemas import StrictSchema
from approvals.reviews.selectors import parse_uuid
from approvals.vocabulary import EffectState, ExecutedBy, ReportedOutcomeLiteral
from reconciliation.effects import command_report_effect
from reconciliation.epochs import occurrence_epoch_request
from reconciliation.selectors import commands as command_reads

router = Router(tags=["execution"])


class InvocationOut(Schema):
    number: int
    kind: Literal["execute", "query", "compensate"]
    epoch: int | None
    justification: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    receipt: str | None
    detail: str | None


class AdmissionOut(Schema):
    justification: str
    basis: str
    decided_by: str
    reason: str | None
    interruption: int | None
    created_at: datetime


class CommandEpochOut(Schema):
    number: int
    execution_id: str
    justification: str
    created_at: datetime
    admission: AdmissionOut | None


class InterruptionOut(Schema):
    id: int
    kind: str
    epoch: int | None
    challenges: list[str] = Field(..., description="Every WWW-Authenticate value, verbatim.")
    detail: str | None
    created_at: datetime
    resolved_at: datetime | None


class CommandDetailOut(Schema):
    command_id: str = Field(..., json_schema_extra=openapi.UUID)
    occurrence_id: str = Field(..., json_schema_extra=openapi.UUID)
    tool: str
    idempotency_key: str
    execution_id: str
    executed_by: ExecutedBy
    state: str
    effect_state: EffectState
    created_at: datetime
    updated_at: datetime
    invocation_count: int
    invocations: list[InvocationOut]
    epochs: list[CommandEpochOut]
    interruptions: list[InterruptionOut]


# A string of a JSON body: the parser refuses a NUL character in any of them.
_Text = Annotated[StrictStr, StringConstraints(pattern=openapi.NO_NUL)]


class EffectIn(StrictSchema):
    execution_id: _Text = Field(..., min_length=1, max_length=200)
    outcome: ReportedOutcomeLiteral
    receipt: _Text | None = Field(None, max_length=200)
    detail: _Text | None = Field(None, max_length=2000)
    challenges: list[_Text] | None = Field(None, max_length=20)


class EpochIn(StrictSchema):
    execution_id: _Text = Field(..., min_length=1, max_length=200)
    reason: _Text = Field(..., min_length=1, max_length=2000)


class EpochOut(Schema):
    occurrence_id: str = Field(..., json_schema_extra=openapi.UUID)
    command_id: str = Field(..., json_schema_extra=openapi.UUID)
    number: int
    execution_id: str
    justification: str
    basis: str
    previous_epoch: int


def _uuid_or_404(value: str) -> uuid.UUID:
    parsed = parse_uuid(value)
    if parsed is None:
        raise Http404
    return parsed


def _command(request: HttpRequest, command_id: str) -> dict[str, Any]:
    command = command_reads.command_get_for_tenant(
        tenant=runtime_key_of(request).tenant, command_id=_uuid_or_404(command_id)
    )
    if command is None:
        raise Http404
    return command_reads.command_detail(command)


@router.get(
    "/commands/{command_id}",
    response={200: CommandDetailOut, **AUTH_ERRORS, 404: ErrorOut},
    summary="A command, its effect, invocations, epochs and interruptions",
)
def command_detail(request: HttpRequest, command_id: str) -> dict[str, Any]:
    return _command(request, command_id)


@router.post(
    "/commands/{command_id}/effect",
    response={
        200: CommandDetailOut,
        **AUTH_ERRORS,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        **BODY_ERRORS,
    },
    summary="Report the effect of a command the runtime executed itself",
)
def command_effect(request: HttpRequest, command_id: str, payload: EffectIn) -> dict[str, Any]:
    key = runtime_key_of(request)
    command_report_effect(
        tenant=key.tenant,
        command_id=_uuid_or_404(command_id),
        execution_id=payload.execution_id,
        outcome=payload.outcome,
        actor=f"runtime:{key.name}",
        receipt=payload.receipt or "",
        detail=payload.detail or "",
        challenges=payload.challenges,
    )
    return _command(request, command_id)


@router.post(
    "/occurrences/{occurrence_id}/epochs",
    response={201: EpochOut, **AUTH_ERRORS, 404: ErrorOut, 409: ErrorOut, **BODY_ERRORS},
    summary="Ask for another attempt at an occurrence (a new epoch)",
)
def occurrence_epoch(
    request: HttpRequest, occurrence_id: str, payload: EpochIn
) -> Status[dict[str, Any]]:
    key = runtime_key_of(request)
    epoch = occurrence_epoch_request(
        tenant=key.tenant,
        occurrence_id=_uuid_or_404(occurrence_id),
        execution_id=payload.execution_id,
        reason=payload.reason,
        actor=f"runtime:{key.name}",
    )
    admission = epoch.admission  # type: ignore[attr-defined]
    return Status(
        201,
        {
            "occurrence_id": str(epoch.occurrence_id),
            "command_id": str(admission.command_id),
            "number": epoch.number,
            "execution_id": epoch.execution_id,
            "justification": epoch.justification,
            "basis": admission.basis,
            "previous_epoch": admission.previous.number,
        },
    )
