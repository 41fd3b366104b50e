"""The API's error envelope, and the error statuses every operation may answer."""

from __future__ import annotations

import json
from typing import Any

from django.http import (
    HttpResponse,
)
from ninja import Field, Schema


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


# Statuses every operation may answer besides its own: the key (401), its request budget
# (429) and the database (503); a JSON body's envelope (400, 413, 415, 422). The drift test
# (tests/api/test_schema.py) checks that every operation lists them.
AUTH_ERRORS: dict[int, type[Schema]] = {401: ErrorOut, 429: ErrorOut, 503: ErrorOut}


BODY_ERRORS: dict[int, type[Schema]] = {400: ErrorOut, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut}
