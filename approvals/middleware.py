from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import structlog
from django.http import HttpRequest, HttpResponse

_TRACE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class TraceIdMiddleware:
    """Give every request a trace id (the caller's ``X-Trace-Id`` if well formed) that
    log lines and audit events carry, and echo it back."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        supplied = request.headers.get("X-Trace-Id", "")
        trace_id = supplied if _TRACE_ID.match(supplied) else uuid.uuid4().hex
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(trace_id=trace_id)
        try:
            response = self.get_response(request)
        finally:
            structlog.contextvars.clear_contextvars()
        response["X-Trace-Id"] = trace_id
        return response
