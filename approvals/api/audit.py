"""``/api/v1/audit/events``: the tenant's audit trail exported as NDJSON (with its cursor),
and other producers' events ingested in NDJSON batches."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from django.http import (
    HttpRequest,
    HttpResponse,
    StreamingHttpResponse,
)
from ninja import Field, Query, Router, Schema
from pydantic import WithJsonSchema, field_validator

from approvals.access import tokens
from approvals.api import openapi
from approvals.api.base import runtime_key_of
from approvals.api.errors import AUTH_ERRORS, BODY_ERRORS, ErrorOut, error_response
from approvals.audit import ingest
from approvals.audit.chain import audit_chain_extend
from approvals.audit.export import AuditFilter, audit_cursor_latest, audit_export
from approvals.audit.ingest import AuditLine
from approvals.canonical.parsing import parse_json
from approvals.errors import ErrorCode, InputError

router = Router()


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
    """One line of the audit export (``approvals.audit.export.audit_event_line``)."""

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


# Events an export chains before it answers; a larger backlog is the beat task's, and the
# export serves what is chained (the next request continues from its last cursor).
AUDIT_EXPORT_CHAIN_LIMIT = 10_000


@router.get(
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


@router.get(
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


# A raw secret of any kind the console issues (approval token, runtime key, reviewer's
# access token, callback signing secret): never stored in the audit trail (a token's
# fingerprint is what names it there). 16 characters after the prefix are enough to refuse:
# a secret cut short still gives most of itself away.
_RAW_TOKEN = re.compile(
    f"(?:{'|'.join(re.escape(prefix) for prefix in tokens.SECRET_PREFIXES)})"
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
            name,
            "raw_token",
            f"{name} holds a raw token, key or secret of this console; send a token's fingerprint.",
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
            ErrorCode.EMPTY_BODY, "The body is empty; send one JSON object per line.", 400
        )
    charset = (request.content_params or {}).get("charset", "utf-8").lower()
    if request.content_type != "application/x-ndjson" or charset not in {"utf-8", "utf8"}:
        return error_response(
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            "Send the batch as Content-Type: application/x-ndjson, one JSON object per line.",
            415,
        )
    too_big = error_response(
        ErrorCode.PAYLOAD_TOO_LARGE,
        f"The body is larger than {AUDIT_INGEST_MAX_BODY_BYTES // 1024} KiB; send smaller batches.",
        413,
    )
    if length > AUDIT_INGEST_MAX_BODY_BYTES:
        return too_big
    raw = request.read(AUDIT_INGEST_MAX_BODY_BYTES + 1)
    return too_big if len(raw) > AUDIT_INGEST_MAX_BODY_BYTES else raw


@router.post(
    "/audit/events",
    response={200: AuditIngestOut, **AUTH_ERRORS, **BODY_ERRORS},
    summary="Ingest other producers' audit events (NDJSON)",
    description="One event per line: `event_id` (the producer's, a UUID), `kind`, "
    "`fingerprint`, `decision`, `execution_id`, `message_id`, `command_id`, `source_time` "
    "(ISO 8601 with an offset), and optionally `reason_code` and `occurrence_id`; the values "
    "an event does not have may be null. A producer event id stored before (by an earlier "
    "batch or an earlier line) is stored once and counted as a duplicate delivery (kept as "
    "one record per batch with the number of its lines, and the line as sent only when it "
    "says something else than the stored event). A bad "
    "line refuses the whole batch with 422, naming each bad line. At most 1 MiB. No value "
    "may hold a raw secret of this console: an approval token, a runtime key, a reviewer's "
    "access token or a callback secret (`raw_token`); each line is strict JSON "
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
            ErrorCode.EMPTY_BODY, "The body is empty; send one JSON object per line.", 400
        )
    ingestion = ingest.audit_ingest(runtime_key=runtime_key_of(request), lines=lines)
    return {
        "received": ingestion.received,
        "new": ingestion.new,
        "duplicates": ingestion.duplicates,
        "ingestion_id": ingestion.pk,
    }
