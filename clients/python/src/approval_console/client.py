"""The agent API client: :class:`ApprovalConsole` (sync, ``httpx.Client``) and
:class:`AsyncApprovalConsole` (async, ``httpx.AsyncClient``), with the same methods.

Retries: an answer ``429`` or ``503`` is retried after the server's ``Retry-After`` (or an
exponential backoff without one), at most ``max_retries`` times and never waiting longer
than ``max_retry_delay`` at once; a broken connection is retried only for requests that are
safe to repeat (reads, a proposal with a ``client_ref``, a pickup with an execution id, a
claim, an effect report). Logs name requests by method, path and status only: no body, no
key, no token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Generic, TypeVar

import httpx

from approval_console import errors
from approval_console.models import (
    PENDING,
    CanonicalAction,
    ClaimResult,
    CommandDetail,
    Occurrence,
    Proposed,
    Token,
    ToolContract,
)

_log = logging.getLogger("approval_console")

T = TypeVar("T")

API_PREFIX = "/api/v1"
RETRY_STATUSES = frozenset({429, 503})
# The longest ``?wait=`` a long-poll asks for (the server allows up to 60 s by default).
LONG_POLL_MAX_SECONDS = 30


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``max_retries`` retries of one request; each waits ``Retry-After`` when the
    server sent it, else ``backoff * 2**n``, capped at ``max_delay`` seconds."""

    max_retries: int = 3
    backoff: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        wait = retry_after if retry_after is not None else self.backoff * (2**attempt)
        return max(0.0, min(wait, self.max_delay))


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def _poll_seconds(remaining: float) -> float:
    """A long-poll's ``?wait=``: whole seconds, at least 1, at most the server's limit."""
    return max(1.0, min(LONG_POLL_MAX_SECONDS, remaining))


@dataclass(frozen=True)
class _Request(Generic[T]):
    """One API call: what to send and how to read a success."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    body: Any = None
    send_body: bool = False
    params: Mapping[str, str] | None = None
    idempotent: bool = False
    timeout: float | None = None
    headers: Mapping[str, str] | None = None
    # 304 Not Modified is an answer (the ETag sent in If-None-Match still holds), not an error.
    not_modified_ok: bool = False


@dataclass(frozen=True)
class _Success(Generic[T]):
    value: T


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, ValueError):
        return None


def _error(response: httpx.Response) -> errors.APIError:
    return errors.error_from_response(
        response.status_code,
        _json(response),
        parse_retry_after(response.headers.get("Retry-After")),
    )


def _occurrence(response: httpx.Response) -> Occurrence:
    return Occurrence.from_json(response.json())


def _tagged_occurrence(response: httpx.Response) -> tuple[Occurrence | None, str | None]:
    """A long-poll's answer: the occurrence (None for 304: unchanged) and its ETag."""
    etag = response.headers.get("ETag")
    if response.status_code == 304:
        return None, etag
    return Occurrence.from_json(response.json()), etag


class _Base:
    """What both clients share: building requests and the retry decision."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        retry: RetryPolicy | None = None,
        poll_interval: float = 2.0,
        long_poll: bool = False,
    ) -> None:
        if not key:
            raise ValueError("a runtime key is required")
        self.base_url = base_url.rstrip("/")
        self._key = key
        self.retry = retry or RetryPolicy()
        self.poll_interval = poll_interval
        # With ``long_poll=True`` ``wait`` asks with ``GET /occurrences/{id}?wait=N`` and the
        # ETag of the last answer, so the server answers as a decision commits (or after N
        # seconds, 304) instead of being asked every ``poll_interval``.
        self.long_poll = long_poll

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}", "Accept": "application/json"}

    # --- the requests -----------------------------------------------------------------

    @staticmethod
    def _propose(
        *,
        tool: str,
        arguments: Mapping[str, Any],
        run_id: str,
        reason: str,
        requested_by: str | None,
        client_ref: str | None,
    ) -> _Request[Proposed]:
        body: dict[str, Any] = {
            "tool": tool,
            "arguments": dict(arguments),
            "run_id": run_id,
            "reason": reason,
        }
        if requested_by is not None:
            body["requested_by"] = requested_by
        if client_ref is not None:
            body["client_ref"] = client_ref
        return _Request(
            "POST",
            "/occurrences",
            lambda r: Proposed.from_json(r.json(), created=r.status_code == 201),
            body=body,
            send_body=True,
            # Idempotent per (run_id, client_ref): the same call again is the same occurrence.
            idempotent=client_ref is not None,
        )

    @staticmethod
    def _get(occurrence_id: str) -> _Request[Occurrence]:
        return _Request("GET", f"/occurrences/{occurrence_id}", _occurrence, idempotent=True)

    @staticmethod
    def _tagged_get(
        occurrence_id: str, etag: str | None, wait: float | None = None
    ) -> _Request[tuple[Occurrence | None, str | None]]:
        """A GET that sends the last ETag (304: unchanged) and, to long-poll, ``?wait=``."""
        return _Request(
            "GET",
            f"/occurrences/{occurrence_id}",
            _tagged_occurrence,
            params={"wait": str(int(wait))} if wait else None,
            idempotent=True,
            timeout=(wait + 10.0) if wait else None,
            headers={"If-None-Match": etag} if etag else None,
            not_modified_ok=True,
        )

    @staticmethod
    def _lookup(run_id: str, client_ref: str) -> _Request[Occurrence]:
        return _Request(
            "GET",
            "/occurrences",
            _occurrence,
            params={"run_id": run_id, "client_ref": client_ref},
            idempotent=True,
        )

    @staticmethod
    def _pickup(occurrence_id: str, execution_id: str) -> _Request[Token]:
        if not execution_id:
            raise ValueError("pickup needs the execution id that will claim (see execution.py)")
        return _Request(
            "POST",
            f"/occurrences/{occurrence_id}/token",
            lambda r: Token.from_json(r.json()),
            body={"execution_id": execution_id},
            send_body=True,
            # The same execution asking again gets a fresh token (a re-delivery).
            idempotent=True,
        )

    @staticmethod
    def _claim(
        token: Token | str,
        *,
        tool: str,
        arguments: Mapping[str, Any],
        execution_id: str,
        message_id: str | None,
    ) -> _Request[ClaimResult]:
        raw = token.reveal() if isinstance(token, Token) else token
        body: dict[str, Any] = {
            "token": raw,
            "action": {"tool": tool, "arguments": dict(arguments)},
            "execution_id": execution_id,
        }
        if message_id is not None:
            body["message_id"] = message_id
        return _Request(
            "POST",
            "/claims",
            lambda r: ClaimResult.from_json(r.json()),
            body=body,
            send_body=True,
            # The same execution claiming again gets duplicate_delivery and the same command.
            idempotent=True,
        )

    @staticmethod
    def _renew(occurrence_id: str) -> _Request[Occurrence]:
        return _Request(
            "POST", f"/occurrences/{occurrence_id}/renew", _occurrence, body=None, send_body=False
        )

    @staticmethod
    def _report_effect(
        command_id: str,
        *,
        execution_id: str,
        outcome: str,
        receipt: str | None,
        detail: str | None,
        challenges: list[str] | None,
    ) -> _Request[CommandDetail]:
        body: dict[str, Any] = {"execution_id": execution_id, "outcome": outcome}
        if receipt is not None:
            body["receipt"] = receipt
        if detail is not None:
            body["detail"] = detail
        if challenges is not None:
            body["challenges"] = challenges
        return _Request(
            "POST",
            f"/commands/{command_id}/effect",
            lambda r: CommandDetail.from_json(r.json()),
            body=body,
            send_body=True,
            # The same report twice is recorded once.
            idempotent=True,
        )

    @staticmethod
    def _command(command_id: str) -> _Request[CommandDetail]:
        return _Request(
            "GET",
            f"/commands/{command_id}",
            lambda r: CommandDetail.from_json(r.json()),
            idempotent=True,
        )

    @staticmethod
    def _tools() -> _Request[list[ToolContract]]:
        return _Request(
            "GET",
            "/tools",
            lambda r: [ToolContract.from_json(t) for t in r.json()["tools"]],
            idempotent=True,
        )

    @staticmethod
    def _tool(name: str) -> _Request[ToolContract]:
        return _Request(
            "GET", f"/tools/{name}", lambda r: ToolContract.from_json(r.json()), idempotent=True
        )

    @staticmethod
    def _canonicalize(
        tool: str, arguments: Mapping[str, Any], run_id: str | None
    ) -> _Request[CanonicalAction]:
        body: dict[str, Any] = {"tool": tool, "arguments": dict(arguments)}
        if run_id is not None:
            body["run_id"] = run_id
        return _Request(
            "POST",
            "/actions/canonicalize",
            lambda r: CanonicalAction.from_json(r.json()),
            body=body,
            send_body=True,
            idempotent=True,
        )

    # --- sending ----------------------------------------------------------------------

    def _build(self, request: _Request[Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "method": request.method,
            "url": f"{self.base_url}{API_PREFIX}{request.path}",
            "headers": self._headers(),
            "params": dict(request.params) if request.params else None,
        }
        if request.headers:
            kwargs["headers"].update(request.headers)
        if request.send_body:
            kwargs["content"] = json.dumps(request.body, ensure_ascii=False).encode()
            kwargs["headers"]["Content-Type"] = "application/json"
        if request.timeout is not None:
            kwargs["timeout"] = request.timeout
        return kwargs

    def _outcome(
        self, request: _Request[T], response: httpx.Response, attempt: int
    ) -> _Success[T] | float:
        """The parsed success, or the seconds to wait before a retry; raises otherwise."""
        _log.debug("%s %s -> %s", request.method, request.path, response.status_code)
        if response.is_success or (request.not_modified_ok and response.status_code == 304):
            return _Success(request.parse(response))
        if response.status_code in RETRY_STATUSES and attempt < self.retry.max_retries:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            _log.info("retrying %s %s after %s", request.method, request.path, response.status_code)
            return self.retry.delay(attempt, retry_after)
        raise _error(response)

    def _transport_retry(
        self, request: _Request[Any], exc: httpx.TransportError, attempt: int
    ) -> float:
        if not request.idempotent or attempt >= self.retry.max_retries:
            raise errors.TransportError(
                f"{request.method} {request.path}: {type(exc).__name__}"
            ) from exc
        _log.info("retrying %s %s after %s", request.method, request.path, type(exc).__name__)
        return self.retry.delay(attempt, None)


class ApprovalConsole(_Base):
    """The synchronous client. ``sleep`` is what waits between retries and polls."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        http: httpx.Client | None = None,
        timeout: float = 15.0,
        retry: RetryPolicy | None = None,
        poll_interval: float = 2.0,
        long_poll: bool = False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            base_url, key, retry=retry, poll_interval=poll_interval, long_poll=long_poll
        )
        self._owns_http = http is None
        self._http = http or httpx.Client(timeout=timeout)
        self._sleep = sleep

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> ApprovalConsole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, request: _Request[T]) -> T:
        attempt = 0
        while True:
            try:
                response = self._http.request(**self._build(request))
            except httpx.TransportError as exc:
                delay = self._transport_retry(request, exc, attempt)
            else:
                outcome = self._outcome(request, response, attempt)
                if isinstance(outcome, _Success):
                    return outcome.value
                delay = outcome
            attempt += 1
            self._sleep(delay)

    def propose(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        run_id: str,
        reason: str,
        client_ref: str | None = None,
        requested_by: str | None = None,
    ) -> Proposed:
        return self._call(
            self._propose(
                tool=tool,
                arguments=arguments,
                run_id=run_id,
                reason=reason,
                requested_by=requested_by,
                client_ref=client_ref,
            )
        )

    def get(self, occurrence_id: str) -> Occurrence:
        return self._call(self._get(occurrence_id))

    def lookup(self, run_id: str, client_ref: str) -> Occurrence | None:
        """The occurrence this run proposed with ``client_ref``, or None; creates nothing."""
        try:
            return self._call(self._lookup(run_id, client_ref))
        except errors.NotFound:
            return None

    def wait(
        self, occurrence_id: str, *, timeout: float = 900.0, while_status: str = PENDING
    ) -> Occurrence:
        """Ask until the occurrence leaves ``while_status`` (a review decided); raises
        :class:`~approval_console.errors.WaitTimeout` after ``timeout`` seconds."""
        return self.watch(
            occurrence_id,
            lambda o: o.status != while_status,
            timeout=timeout,
            what=f"still {while_status}",
        )

    def watch(
        self,
        occurrence_id: str,
        until: Callable[[Occurrence], bool],
        *,
        timeout: float,
        what: str = "unchanged",
    ) -> Occurrence:
        """Read the occurrence (long-polling with ``long_poll``) until ``until(occurrence)``
        holds, and return it; raises :class:`~approval_console.errors.WaitTimeout` after
        ``timeout`` seconds. A command's effect changes the occurrence too."""
        deadline = time.monotonic() + timeout
        etag: str | None = None
        while True:
            remaining = deadline - time.monotonic()
            # The first ask is a plain read: a long-poll waits for a change from the state
            # its If-None-Match names, so it needs the ETag of the state seen last.
            wait = _poll_seconds(remaining) if self.long_poll else None
            answer, etag = self._call(self._tagged_get(occurrence_id, etag, wait if etag else None))
            if answer is not None and until(answer):
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.WaitTimeout(
                    f"occurrence {occurrence_id} is {what} after {timeout:g} s"
                )
            if not self.long_poll:
                self._sleep(min(self.poll_interval, remaining))

    def pickup(self, occurrence_id: str, execution_id: str) -> Token:
        """The approval's token for ``execution_id`` (again, after a crash: a re-delivery)."""
        return self._call(self._pickup(occurrence_id, execution_id))

    def claim(
        self,
        token: Token | str,
        *,
        tool: str,
        arguments: Mapping[str, Any],
        execution_id: str,
        message_id: str | None = None,
    ) -> ClaimResult:
        return self._call(
            self._claim(
                token,
                tool=tool,
                arguments=arguments,
                execution_id=execution_id,
                message_id=message_id,
            )
        )

    def renew(self, occurrence_id: str) -> Occurrence:
        return self._call(self._renew(occurrence_id))

    def report_effect(
        self,
        command_id: str,
        *,
        execution_id: str,
        outcome: str,
        receipt: str | None = None,
        detail: str | None = None,
        challenges: list[str] | None = None,
    ) -> CommandDetail:
        return self._call(
            self._report_effect(
                command_id,
                execution_id=execution_id,
                outcome=outcome,
                receipt=receipt,
                detail=detail,
                challenges=challenges,
            )
        )

    def command(self, command_id: str) -> CommandDetail:
        return self._call(self._command(command_id))

    def tools(self) -> list[ToolContract]:
        return self._call(self._tools())

    def tool(self, name: str) -> ToolContract:
        return self._call(self._tool(name))

    def canonicalize(
        self, tool: str, arguments: Mapping[str, Any], *, run_id: str | None = None
    ) -> CanonicalAction:
        """The action's canonical form and digest; with ``run_id`` also that run's earlier
        rejections of the same action (``prior_decisions``). Writes nothing."""
        return self._call(self._canonicalize(tool, arguments, run_id))


async def _async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


class AsyncApprovalConsole(_Base):
    """The asynchronous client: the same methods as :class:`ApprovalConsole`, awaited."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        http: httpx.AsyncClient | None = None,
        timeout: float = 15.0,
        retry: RetryPolicy | None = None,
        poll_interval: float = 2.0,
        long_poll: bool = False,
        sleep: Callable[[float], Awaitable[None]] = _async_sleep,
    ) -> None:
        super().__init__(
            base_url, key, retry=retry, poll_interval=poll_interval, long_poll=long_poll
        )
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._sleep = sleep

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncApprovalConsole:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, request: _Request[T]) -> T:
        attempt = 0
        while True:
            try:
                response = await self._http.request(**self._build(request))
            except httpx.TransportError as exc:
                delay = self._transport_retry(request, exc, attempt)
            else:
                outcome = self._outcome(request, response, attempt)
                if isinstance(outcome, _Success):
                    return outcome.value
                delay = outcome
            attempt += 1
            await self._sleep(delay)

    async def propose(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        run_id: str,
        reason: str,
        client_ref: str | None = None,
        requested_by: str | None = None,
    ) -> Proposed:
        return await self._call(
            self._propose(
                tool=tool,
                arguments=arguments,
                run_id=run_id,
                reason=reason,
                requested_by=requested_by,
                client_ref=client_ref,
            )
        )

    async def get(self, occurrence_id: str) -> Occurrence:
        return await self._call(self._get(occurrence_id))

    async def lookup(self, run_id: str, client_ref: str) -> Occurrence | None:
        try:
            return await self._call(self._lookup(run_id, client_ref))
        except errors.NotFound:
            return None

    async def wait(
        self, occurrence_id: str, *, timeout: float = 900.0, while_status: str = PENDING
    ) -> Occurrence:
        return await self.watch(
            occurrence_id,
            lambda o: o.status != while_status,
            timeout=timeout,
            what=f"still {while_status}",
        )

    async def watch(
        self,
        occurrence_id: str,
        until: Callable[[Occurrence], bool],
        *,
        timeout: float,
        what: str = "unchanged",
    ) -> Occurrence:
        """See :meth:`ApprovalConsole.watch`."""
        deadline = time.monotonic() + timeout
        etag: str | None = None
        while True:
            remaining = deadline - time.monotonic()
            # The first ask is a plain read (see ApprovalConsole.watch).
            wait = _poll_seconds(remaining) if self.long_poll else None
            request = self._tagged_get(occurrence_id, etag, wait if etag else None)
            answer, etag = await self._call(request)
            if answer is not None and until(answer):
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.WaitTimeout(
                    f"occurrence {occurrence_id} is {what} after {timeout:g} s"
                )
            if not self.long_poll:
                await self._sleep(min(self.poll_interval, remaining))

    async def pickup(self, occurrence_id: str, execution_id: str) -> Token:
        return await self._call(self._pickup(occurrence_id, execution_id))

    async def claim(
        self,
        token: Token | str,
        *,
        tool: str,
        arguments: Mapping[str, Any],
        execution_id: str,
        message_id: str | None = None,
    ) -> ClaimResult:
        return await self._call(
            self._claim(
                token,
                tool=tool,
                arguments=arguments,
                execution_id=execution_id,
                message_id=message_id,
            )
        )

    async def renew(self, occurrence_id: str) -> Occurrence:
        return await self._call(self._renew(occurrence_id))

    async def report_effect(
        self,
        command_id: str,
        *,
        execution_id: str,
        outcome: str,
        receipt: str | None = None,
        detail: str | None = None,
        challenges: list[str] | None = None,
    ) -> CommandDetail:
        return await self._call(
            self._report_effect(
                command_id,
                execution_id=execution_id,
                outcome=outcome,
                receipt=receipt,
                detail=detail,
                challenges=challenges,
            )
        )

    async def command(self, command_id: str) -> CommandDetail:
        return await self._call(self._command(command_id))

    async def tools(self) -> list[ToolContract]:
        return await self._call(self._tools())

    async def tool(self, name: str) -> ToolContract:
        return await self._call(self._tool(name))

    async def canonicalize(
        self, tool: str, arguments: Mapping[str, Any], *, run_id: str | None = None
    ) -> CanonicalAction:
        return await self._call(self._canonicalize(tool, arguments, run_id))
