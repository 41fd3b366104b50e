"""The console's own error pages: 404, 403 and 500, in the console's layout, with a way
back to the inbox, never a stack trace, a URL list or text an agent wrote.

``config/urls.py`` names the views below as Django's ``handler404``/``handler403`` (and
its ``handler500`` renders ``server_error``). Django calls them with ``DEBUG`` off. With
``DEBUG`` on (``bin/demo``) Django answers a 404 with its technical page, which lists every
URL pattern, and an uncaught exception with its traceback page; ``ErrorPagesMiddleware``
gives those requests the same handlers, so the demo shows what production shows (the
traceback still goes to the log, through ``django.request``). Paths under ``/api/`` keep
the agent API's JSON error envelope either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.shortcuts import render
from django.template import loader
from django.urls import get_resolver, get_urlconf
from django.utils.log import log_response

from approvals.api.errors import error_response
from approvals.errors import ErrorCode
from approvals.web.home import role_home, role_home_label
from approvals.web.selectors.access import console_access

API_PREFIX = "/api/"


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return error_response(ErrorCode.NOT_FOUND, "No such API endpoint.", 404)
    # The exception's text is not shown: under DEBUG a resolver 404 carries the URL
    # patterns it tried, and a view's message may name what the reader may not see.
    return render(request, "404.html", {}, status=404)


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return error_response(
            ErrorCode.FORBIDDEN, "This is not allowed with these credentials.", 403
        )
    # A PermissionDenied raised by the console carries a sentence written for the reader
    # ("Only operators of a tenant can open the operations console."), never agent text.
    reason = str(exception) if isinstance(exception, PermissionDenied) and exception.args else ""
    return render(request, "403.html", {"reason": reason, **home_of(request)}, status=403)


def home_of(request: HttpRequest) -> dict[str, Any]:
    """Where the reader's way back leads (their role's home), and whether they are an admin
    somewhere: an admin is never told to ask an admin."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {
            "home_url": settings.LOGIN_URL,
            "home_label": "Sign in",
            "is_admin_somewhere": False,
        }
    access = console_access(user)
    home = role_home(access)
    return {
        "home_url": home,
        "home_label": role_home_label(home),
        "is_admin_somewhere": any(access.is_admin(t.pk) for t in access.tenants),
    }


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api(request):
        return error_response(ErrorCode.SERVER_ERROR, "The console hit an unexpected error.", 500)
    # Rendered without the request's context (no user, session or tenant): whatever broke
    # may be what the context processors would read.
    trace_id = structlog.contextvars.get_contextvars().get("trace_id", "")
    body = loader.get_template("500.html").render({"trace_id": trace_id})
    return HttpResponse(body, status=500)


_Handler = Callable[..., HttpResponse]


def _handler(status: int) -> _Handler:
    """The handler the current URLconf names for ``status``, as Django looks it up."""
    handler: _Handler = get_resolver(get_urlconf()).resolve_error_handler(status)
    return handler


# Exceptions Django answers through its handlers, or as 400s, whatever DEBUG says: left to it.
_LEFT_TO_DJANGO = (PermissionDenied, BadRequest, SuspiciousOperation, MultiPartParserError)


class ErrorPagesMiddleware:
    """Under DEBUG, the console's 404 and 500 pages instead of Django's technical ones.

    With DEBUG off it does nothing: Django calls the handlers itself. Sits after the
    authentication middleware (the 404 page shows who is signed in) and inside the CSP
    and no-store middleware, which apply to its pages as to any other."""

    # Runs as the chain around it runs (on the event loop under ASGI, where the page for
    # a 404 is rendered in a thread); with DEBUG off it only passes the request on.
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return self._console_404(request, self.get_response(request))

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        response = await self.get_response(request)
        if not settings.DEBUG:
            return response
        return await sync_to_async(self._console_404)(request, response)

    def _console_404(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        # No URL pattern matched: Django answered with its technical 404 before any view
        # (or this middleware's process_exception) ran, so resolver_match is still None.
        if (
            settings.DEBUG
            and response.status_code == 404
            and getattr(request, "resolver_match", None) is None
        ):
            logged = getattr(response, "_has_been_logged", False)
            response = _handler(404)(request, Http404())
            # Django has logged this 404 once already ("Not Found: ..."): once is enough.
            response._has_been_logged = logged  # type: ignore[attr-defined]
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        if not settings.DEBUG or settings.DEBUG_PROPAGATE_EXCEPTIONS:
            return None
        if isinstance(exception, Http404):
            return _handler(404)(request, exception)
        if isinstance(exception, _LEFT_TO_DJANGO):
            return None
        # What Django does with an uncaught exception, but with the console's page: the
        # signal (the test client re-raises from it), then the log line with the traceback.
        signals.got_request_exception.send(sender=None, request=request)
        response = _handler(500)(request)
        log_response(
            "%s: %s",
            response.reason_phrase,
            request.path,
            response=response,
            request=request,
            exception=exception,
        )
        return response
