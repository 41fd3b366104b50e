from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import structlog
from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers

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


class NoStoreMiddleware:
    """``Cache-Control: no-store`` on the console's HTML: pages show who may approve what
    and stay in a browser's or a shared proxy's cache after sign-out otherwise.

    Only HTML and the agent API (``/api/``), so static files stay cacheable; a response
    that already chose its ``Cache-Control`` keeps it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        is_html = response.get("Content-Type", "").startswith("text/html")
        # Every agent API answer too: a token pickup carries the raw token, and the others
        # carry a tenant's occurrences, commands and audit trail.
        is_api = request.path.startswith("/api/")
        if (is_html or is_api) and not response.has_header("Cache-Control"):
            add_never_cache_headers(response)
        return response
