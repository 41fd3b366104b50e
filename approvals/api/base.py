"""The agent API v1: the ninja API object, its authentication (runtime keys, reviewers'
access tokens), its rate limit, and how every failure becomes the error envelope.

Every error is ``{"error": {"code", "message", "details"?}}`` with a 4xx status: 400 for a
body that is not JSON at all, 413 above 64 KiB, 415 for another content type, 422 for JSON
that is refused (``details`` names each field). Bodies are parsed strictly (see
``approvals.canonical.parsing``) before any row is written."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

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
)
from django.urls import URLPattern, URLResolver
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_variables
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError
from ninja.openapi.schema import OpenAPISchema
from ninja.operation import Operation
from ninja.parser import Parser
from ninja.security import HttpBearer
from ninja.throttling import BaseThrottle

from approvals.access import ratelimit, reviewer_tokens
from approvals.access.runtime_keys import runtime_key_authenticate
from approvals.api import contract_openapi, longpoll, openapi
from approvals.api.errors import error_response
from approvals.canonical.parsing import parse_json
from approvals.errors import ErrorCode, InputError, ServiceError
from approvals.models import (
    ReviewerToken,
    RuntimeKey,
    ToolContract,
)


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


class RuntimeKeyAuth(HttpBearer):
    @method_decorator(sensitive_variables("token"))
    def authenticate(self, request: HttpRequest, token: str) -> RuntimeKey | None:
        return runtime_key_authenticate(token)


class ReviewerTokenAuth(HttpBearer):
    """A reviewer's personal access token (``approvals.access.reviewer_tokens``)."""

    @method_decorator(sensitive_variables("token"))
    def authenticate(self, request: HttpRequest, token: str) -> ReviewerToken | None:
        return reviewer_tokens.reviewer_token_authenticate(token)


class RuntimeKeyThrottle(BaseThrottle):
    """Requests per runtime key, or per reviewer's access token, per window
    (``approvals.access.ratelimit``), run by ninja after authentication on every operation.
    ninja asks ``allow_request`` and then ``wait`` of one shared instance, so what the
    answer needs is kept per thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def allow_request(self, request: HttpRequest) -> bool:
        caller = getattr(request, "auth", None)
        if not isinstance(caller, RuntimeKey | ReviewerToken):
            return True
        if getattr(request, "scope", {}).get(longpoll.REREAD_SCOPE_KEY):
            # A long-poll's later reads (approvals.longpoll): its first read was counted.
            self._local.wait, self._local.limit = None, None
            return True
        if isinstance(caller, ReviewerToken):
            admission = ratelimit.token_request_admit(caller)
            self._local.caller = "access token"
        else:
            admission = ratelimit.request_admit(caller)
            self._local.caller = "runtime key"
        self._local.wait = admission.retry_after
        self._local.limit = admission.limit
        return admission.allowed

    def wait(self) -> float | None:
        wait: int | None = getattr(self._local, "wait", None)
        return wait

    def limit(self) -> int | None:
        limit: int | None = getattr(self._local, "limit", None)
        return limit

    def caller(self) -> str:
        """What was counted: "runtime key" or "access token"."""
        return str(getattr(self._local, "caller", "runtime key"))


def _enveloped_405(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """ninja answers a wrong method with a plain-text 405; give it the error envelope."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            allowed = response["Allow"]
            response = error_response(
                ErrorCode.METHOD_NOT_ALLOWED,
                f"{request.method} is not allowed here; use {allowed}.",
                405,
            )
            response["Allow"] = allowed
        return response

    return wrapper


class AgentAPI(NinjaAPI):
    _documents = contract_openapi.DocumentCache()

    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None
    ) -> OpenAPISchema:
        # ninja's document, plus what it cannot derive from the operations: response
        # headers, links between operations, UUID path parameters (approvals.api.openapi),
        # and the tool contracts as they are now (approvals.api.contract_openapi).
        if path_prefix is None:
            path_prefix = self.get_root_path(path_params or {})
        contracts = [
            (name, schema)
            for name, schema in ToolContract.objects.order_by("name").values_list(
                "name", "json_schema"
            )
        ]

        def build() -> dict[str, Any]:
            schema = super(AgentAPI, self).get_openapi_schema(path_prefix=path_prefix)
            openapi.complete(schema)
            contract_openapi.add_contracts(schema, contracts)
            # ninja's OpenAPISchema is a dict that also holds the API object; the cache
            # keeps (and copies) the document alone.
            return dict(schema)

        document: OpenAPISchema = self._documents.get(
            path_prefix, contract_openapi.contracts_version(contracts), build
        )
        return document

    def get_openapi_operation_id(self, operation: Operation) -> str:
        # The ids API v1 was published with, "<app>_api_<view>", whichever module of the
        # app's API the view lives in: generated clients name their methods after them.
        app = operation.view_func.__module__.partition(".")[0]
        return f"{app}_api_{operation.view_func.__name__}"

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
_RETRY_AFTER_SECONDS = {ErrorCode.NOT_APPROVED: 5}


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja wraps parser failures in a 400; unwrap them to keep their precise code.
    if isinstance(exc.__cause__, InputError):
        return _input_error(request, exc.__cause__)
    return error_response(ErrorCode.BAD_REQUEST, str(exc), exc.status_code)


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    limit = settings.API_MAX_BODY_BYTES // 1024
    return error_response(ErrorCode.PAYLOAD_TOO_LARGE, f"The body is larger than {limit} KiB.", 413)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = error_response(
        ErrorCode.UNAUTHENTICATED,
        "Send a valid, active runtime key as 'Authorization: Bearer <key>'.",
        401,
    )
    response["WWW-Authenticate"] = 'Bearer realm="agent-api"'
    return response


@api.exception_handler(Throttled)
def _rate_limited(request: HttpRequest, exc: Throttled) -> HttpResponse:
    retry_after = int(exc.wait or 1)
    limit = _throttle.limit()
    window = settings.API_RATE_WINDOW_SECONDS
    response = error_response(
        ErrorCode.RATE_LIMITED,
        f"This {_throttle.caller()} made more than {limit} requests in {window} seconds; "
        f"retry after {retry_after} seconds.",
        429,
    )
    response["Retry-After"] = str(retry_after)
    return response


def database_unavailable_response() -> HttpResponse:
    """``503 database_unavailable`` with ``Retry-After``: nothing was written (every change
    is one transaction, which the database rolls back when it goes away)."""
    response = error_response(
        ErrorCode.DATABASE_UNAVAILABLE,
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
    return error_response(
        ErrorCode.NOT_FOUND, "No such resource for this runtime key's tenant.", 404
    )


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
        return error_response(ErrorCode.EMPTY_BODY, "The body is empty; send a JSON object.", 400)
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
