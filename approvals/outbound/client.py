"""The HTTP client for every call the console makes out: callbacks, the escalation webhook
and the adapters' calls.

Each call is bounded three ways, so that no receiver holds a worker:

- per operation: a connect timeout (``ADAPTER_CONNECT_TIMEOUT``) and a read and write
  timeout (``ADAPTER_READ_TIMEOUT``), as before;
- in total: ``OUTBOUND_DEADLINE_SECONDS`` from the start of the request to the last byte
  of its answer. A receiver that drips a byte every few seconds never trips a read
  timeout; every read and write here is given at most what is left of the deadline;
- in size: at most ``OUTBOUND_MAX_RESPONSE_BYTES`` of the answer's body are read; a
  larger answer fails the call (``ResponseTooLarge``) instead of filling the worker's memory.

With ``public_only`` (callbacks and escalation, unless ``CALLBACK_ALLOW_PRIVATE_HOSTS``)
the name is resolved when the connection is made, every address it resolves to must be
public (``approvals.outbound.addresses``), and the connection goes to the address that was
checked, never to a second answer of the resolver: a refusal is an ``httpx.ConnectError``
(nothing was sent). Environment proxies (``HTTP_PROXY``) are not used: the address checked
must be the one connected to.
"""

from __future__ import annotations

import math
import os
import ssl
import threading
import time
import typing

import httpcore
import httpx
from django.conf import settings

from approvals.outbound import addresses as network


class ResponseTooLarge(httpx.ReadError):
    """The answer's body was longer than ``OUTBOUND_MAX_RESPONSE_BYTES``."""


PASSED = "the call's total deadline (OUTBOUND_DEADLINE_SECONDS) passed"

T = typing.TypeVar("T")


class _Deadline(threading.local):
    """When the current request of this client must be over (per thread: a client may be
    shared, a request is not)."""

    at: float = math.inf

    def bound(
        self,
        operation: typing.Callable[[float], T],
        timeout: float | None,
        expired: type[Exception],
    ) -> T:
        """``operation(timeout)`` with ``timeout`` shortened to what is left of the
        deadline; ``expired`` (saying so) when that is what ended it."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise expired(PASSED)
        try:
            return operation(left if timeout is None else min(timeout, left))
        except expired:
            if time.monotonic() >= self.at:
                raise expired(PASSED) from None
            raise


class _Stream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the deadline."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._inner = inner
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._deadline.bound(
            lambda left: self._inner.read(max_bytes, left), timeout, httpcore.ReadTimeout
        )

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._deadline.bound(
            lambda left: self._inner.write(buffer, left), timeout, httpcore.WriteTimeout
        )

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: typing.Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        tls = self._deadline.bound(
            lambda left: self._inner.start_tls(ssl_context, server_hostname, left),
            timeout,
            httpcore.ConnectTimeout,
        )
        return _Stream(tls, self._deadline)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """Where httpcore resolves a name and connects: here the address is checked and the
    connection made to that very address."""

    def __init__(self, *, public_only: bool, deadline: _Deadline) -> None:
        self._inner = httpcore.SyncBackend()
        self._public_only = public_only
        self._deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            found = network.resolve(host, port)
        except (OSError, UnicodeError, ValueError) as exc:
            raise httpcore.ConnectError(f"{host} does not resolve: {exc}") from exc
        if self._public_only:
            refused = [address for address in found if not network.is_public(address)]
            if refused:
                raise httpcore.ConnectError(
                    f"{host} resolves to {refused[0]}, not a public address "
                    "(CALLBACK_ALLOW_PRIVATE_HOSTS is off): not called"
                )
        failure: Exception = httpcore.ConnectError(f"{host} resolves to no address")
        for address in found:

            def connect(left: float, address: str = str(address)) -> httpcore.NetworkStream:
                return self._inner.connect_tcp(
                    address,
                    port,
                    timeout=left,
                    local_address=local_address,
                    socket_options=socket_options,
                )

            try:
                stream = self._deadline.bound(connect, timeout, httpcore.ConnectTimeout)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            return _Stream(stream, self._deadline)
        raise failure

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("the console calls out over TCP only")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


# httpcore's errors as the httpx errors callers catch (an adapter tells "never sent",
# ConnectError and the connect and pool timeouts, from "sent, answer unknown").
_ERRORS: dict[type[Exception], type[httpx.TransportError]] = {
    httpcore.ConnectTimeout: httpx.ConnectTimeout,
    httpcore.ReadTimeout: httpx.ReadTimeout,
    httpcore.WriteTimeout: httpx.WriteTimeout,
    httpcore.PoolTimeout: httpx.PoolTimeout,
    httpcore.ConnectError: httpx.ConnectError,
    httpcore.ReadError: httpx.ReadError,
    httpcore.WriteError: httpx.WriteError,
    httpcore.LocalProtocolError: httpx.LocalProtocolError,
    httpcore.RemoteProtocolError: httpx.RemoteProtocolError,
    httpcore.UnsupportedProtocol: httpx.UnsupportedProtocol,
    httpcore.ProxyError: httpx.ProxyError,
    httpcore.TimeoutException: httpx.TimeoutException,
    httpcore.NetworkError: httpx.NetworkError,
    httpcore.ProtocolError: httpx.ProtocolError,
}

_HTTPCORE_ERRORS = tuple(_ERRORS)


def _as_httpx(exc: Exception, request: httpx.Request) -> httpx.TransportError:
    """The httpx error for an httpcore one (the most specific class first), else ``exc``."""
    for kind in type(exc).__mro__:
        if kind in _ERRORS:
            return _ERRORS[kind](str(exc), request=request)
    raise TypeError(f"not an httpcore error: {exc!r}")


class _Answer(httpx.SyncByteStream):
    """An answer's body: httpcore's stream, its errors as httpx's, at most ``limit`` bytes."""

    def __init__(self, inner: typing.Iterable[bytes], limit: int, request: httpx.Request) -> None:
        self._inner = inner
        self._limit = limit
        self._request = request

    def __iter__(self) -> typing.Iterator[bytes]:
        read = 0
        try:
            for chunk in self._inner:
                read += len(chunk)
                if read > self._limit:
                    raise ResponseTooLarge(
                        f"the answer is larger than {self._limit} bytes "
                        "(OUTBOUND_MAX_RESPONSE_BYTES): not read further",
                        request=self._request,
                    )
                yield chunk
        except _HTTPCORE_ERRORS as exc:
            raise _as_httpx(exc, self._request) from exc

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


class OutboundTransport(httpx.BaseTransport):
    """httpx's transport interface over an httpcore connection pool built with this
    module's network backend (where names are resolved and addresses checked), through
    both libraries' public APIs: httpx's own transport takes no network backend."""

    def __init__(
        self,
        *,
        public_only: bool,
        deadline_seconds: float,
        max_bytes: int,
        keepalive_seconds: float | None = None,
    ) -> None:
        self._deadline = _Deadline()
        self._deadline_seconds = deadline_seconds
        self._max_bytes = max_bytes
        self._pool = httpcore.ConnectionPool(
            ssl_context=_ssl_context(),
            network_backend=_Backend(public_only=public_only, deadline=self._deadline),
            # None: idle connections are kept as long as the client; 0: none is kept.
            max_keepalive_connections=0 if keepalive_seconds == 0 else None,
            keepalive_expiry=keepalive_seconds or None,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self._deadline.at = time.monotonic() + self._deadline_seconds
        assert isinstance(request.stream, httpx.SyncByteStream)
        sent = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            answer = self._pool.handle_request(sent)
        except _HTTPCORE_ERRORS as exc:
            raise _as_httpx(exc, request) from exc
        declared = httpx.Headers(answer.headers).get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_bytes:
            answer.close()
            raise ResponseTooLarge(
                f"the answer declares {declared} bytes, more than {self._max_bytes} "
                "(OUTBOUND_MAX_RESPONSE_BYTES): not read",
                request=request,
            )
        assert isinstance(answer.stream, typing.Iterable)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_Answer(answer.stream, self._max_bytes, request),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._pool.close()


_contexts: dict[int, ssl.SSLContext] = {}
_clients: dict[tuple[typing.Any, ...], httpx.Client] = {}
_lock = threading.RLock()  # the client is built under it, and its TLS context too


def _ssl_context() -> ssl.SSLContext:
    """The process's TLS context: loading the CA bundle cost every call about 40 ms of CPU
    (``bench/README.md``, the worker's profile), for the same certificates each time."""
    pid = os.getpid()
    context = _contexts.get(pid)
    if context is None:
        with _lock:
            context = _contexts.setdefault(pid, httpx.create_ssl_context())
    return context


def _client(*, public_only: bool, keepalive_seconds: float | None) -> httpx.Client:
    timeout = httpx.Timeout(
        connect=settings.ADAPTER_CONNECT_TIMEOUT,
        read=settings.ADAPTER_READ_TIMEOUT,
        write=settings.ADAPTER_READ_TIMEOUT,
        pool=settings.ADAPTER_CONNECT_TIMEOUT,
    )
    transport = OutboundTransport(
        public_only=public_only,
        deadline_seconds=settings.OUTBOUND_DEADLINE_SECONDS,
        max_bytes=settings.OUTBOUND_MAX_RESPONSE_BYTES,
        keepalive_seconds=keepalive_seconds,
    )
    return httpx.Client(timeout=timeout, follow_redirects=False, transport=transport)


def outbound_client(*, public_only: bool) -> httpx.Client:
    """A client for one outbound call (or a few, one after another), with the settings'
    timeouts, deadline and size cap; redirects are not followed. Close it after use."""
    return _client(public_only=public_only, keepalive_seconds=None)


def pooled_client(*, public_only: bool) -> httpx.Client:
    """The process's client for the adapters' calls: one per process (a forked worker gets
    its own) and per configuration, never closed by its users. It keeps a connection to a
    receiver for ``ADAPTER_KEEPALIVE_SECONDS`` after an answer (0: none kept) and reuses it
    only within that time, which must be shorter than the receiver's own keep-alive: a
    connection the receiver closes just as a request goes out would make that call's
    outcome unknown (recorded as such, never sent again blindly)."""
    keepalive = float(settings.ADAPTER_KEEPALIVE_SECONDS)
    key = (
        os.getpid(),
        public_only,
        keepalive,
        settings.ADAPTER_CONNECT_TIMEOUT,
        settings.ADAPTER_READ_TIMEOUT,
        settings.OUTBOUND_DEADLINE_SECONDS,
        settings.OUTBOUND_MAX_RESPONSE_BYTES,
    )
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _client(public_only=public_only, keepalive_seconds=keepalive)
                _clients[key] = client
    return client
