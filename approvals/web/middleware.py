from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers

_TRACE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class AsyncCapableMiddleware:
    """A middleware that runs as the chain around it runs (Django's "Asynchronous support"
    for middleware): on the event loop under ASGI, so a request does not hop to a thread
    for it, in the request's thread under WSGI. Subclasses say what happens before
    (``before``) and after (``after``) the rest of the chain."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        state = self.before(request)
        try:
            response = self.get_response(request)
        finally:
            self.done(state)
        return self.after(request, response, state)

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        state = self.before(request)
        try:
            response = await self.get_response(request)
        finally:
            self.done(state)
        return self.after(request, response, state)

    def before(self, request: HttpRequest) -> Any:
        return None

    def done(self, state: Any) -> None:
        """After the rest of the chain, whether it answered or raised."""

    def after(self, request: HttpRequest, response: HttpResponse, state: Any) -> HttpResponse:
        return response


class TraceIdMiddleware(AsyncCapableMiddleware):
    """Give every request a trace id (the caller's ``X-Trace-Id`` if well formed) that
    log lines and audit events carry, and echo it back."""

    def before(self, request: HttpRequest) -> str:
        supplied = request.headers.get("X-Trace-Id", "")
        trace_id = supplied if _TRACE_ID.match(supplied) else uuid.uuid4().hex
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(trace_id=trace_id)
        return trace_id

    def done(self, state: Any) -> None:
        structlog.contextvars.clear_contextvars()

    def after(self, request: HttpRequest, response: HttpResponse, state: Any) -> HttpResponse:
        response["X-Trace-Id"] = state
        return response


class NoStoreMiddleware(AsyncCapableMiddleware):
    """``Cache-Control: no-store`` on the console's HTML: pages show who may approve what
    and stay in a browser's or a shared proxy's cache after sign-out otherwise.

    Only HTML and the agent API (``/api/``), so static files stay cacheable; a response
    that already chose its ``Cache-Control`` keeps it."""

    def after(self, request: HttpRequest, response: HttpResponse, state: Any) -> HttpResponse:
        is_html = response.get("Content-Type", "").startswith("text/html")
        # Every agent API answer too: a token pickup carries the raw token, and the others
        # carry a tenant's occurrences, commands and audit trail.
        is_api = request.path.startswith("/api/")
        if (is_html or is_api) and not response.has_header("Cache-Control"):
            add_never_cache_headers(response)
        return response
