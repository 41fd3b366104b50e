"""The long-poll of ``GET /api/v1/occurrences/{id}?wait=N``, served without holding a thread.

``LongPollApp`` sits in front of Django's ASGI application (``config/asgi.py``). A request
with a valid ``wait`` is answered by asking Django itself, as an ordinary request without
``wait`` (authentication, tenant scope, rate limit, ETag and error envelope are Django's,
on every read), and waiting *between* those reads on the event loop, holding no thread and
no database connection:

1. it subscribes to the occurrence's changes, then reads the occurrence once (the one read
   the key's rate limit counts: the later reads are marked in the ASGI scope). An error, or
   an answer that differs from the client's ``If-None-Match``, goes back at once;
2. otherwise it waits for a notification (``ChangeFeed``) and reads again with the first
   read's ``ETag`` in ``If-None-Match``: a ``304`` means nothing the API shows changed
   (the notification was for a detail it does not show) and it waits on; anything else is
   the answer;
3. when ``wait`` seconds have passed it reads once more and answers with that: the
   unchanged state (``200``, or ``304`` for a client that sent a matching
   ``If-None-Match``).

``ChangeFeed`` holds one PostgreSQL connection per process (per event loop) that LISTENs on
``occurrence_changed``, which triggers on the occurrence, proposal, approval, command and
epoch tables NOTIFY in the changing transaction (migration 0019), so waiters wake as the
deciding transaction commits. While that connection is down (or on SQLite, which has no
LISTEN), waiters read every ``LONG_POLL_FALLBACK_SECONDS`` instead; each reconnect wakes
every waiter once, for the notifications it may have missed.

Without this app in front (WSGI: ``runserver``, Django's test client, a WSGI server), the
API view waits itself by reading every ``LONG_POLL_FALLBACK_SECONDS`` in its thread
(``approvals.api``): the same answers, at the cost of a thread per waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import weakref
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import psycopg
import structlog
from django.conf import settings
from django.db import connections
from psycopg.conninfo import make_conninfo

from approvals import metrics

CHANNEL = "occurrence_changed"
# Marks the reads a long-poll makes after its first (see ``_LongPoll._reread``).
REREAD_SCOPE_KEY = "console.long_poll_reread"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# Django's ASGIHandler types its arguments a little differently (dict, Mapping): any will do.
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

_log = structlog.get_logger("approvals.longpoll")

_OCCURRENCE_PATH = re.compile(
    r"/api/v1/occurrences/(?P<id>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
    r"[0-9a-fA-F]{4}-[0-9a-fA-F]{12})/?"
)


# ASCII digits only: str.isdigit() and int() also take "\uff11" (fullwidth), "\u0663"
# (Arabic-Indic) and, for isdigit() alone, "\u00b2", on which int() raises.
WAIT_DIGITS = re.compile(r"[0-9]+")


def parse_wait(raw: str) -> int | None:
    """Seconds to wait, or None when ``raw`` is not a whole number in 1..LONG_POLL_MAX_SECONDS
    written in ASCII digits (0 and anything invalid are left to the API view: 0 answers at
    once, the rest is 422, by the same rule: ``WaitQuery``)."""
    if len(raw) > 4 or not WAIT_DIGITS.fullmatch(raw):
        return None
    seconds = int(raw)
    if 1 <= seconds <= settings.LONG_POLL_MAX_SECONDS:
        return seconds
    return None


# How the LISTEN connection shows in pg_stat_activity.
LISTEN_APPLICATION_NAME = "console-longpoll"


def listen_conninfo() -> str | None:
    """The default database's connection string, or None when it cannot LISTEN (SQLite)."""
    if connections["default"].vendor != "postgresql":
        return None
    database = connections["default"].settings_dict
    params: dict[str, Any] = {
        "dbname": database.get("NAME") or None,
        "user": database.get("USER") or None,
        "password": database.get("PASSWORD") or None,
        "host": database.get("HOST") or None,
        "port": database.get("PORT") or None,
        "application_name": LISTEN_APPLICATION_NAME,
    }
    # libpq's own options (sslmode, sslrootcert...); Django's (pool, isolation_level,
    # server_side_binding...) are not connection-string keywords.
    for key, value in (database.get("OPTIONS") or {}).items():
        if key in _LIBPQ_OPTIONS and isinstance(value, str | int):
            params[key] = value
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})


_LIBPQ_OPTIONS = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslpassword",
        "passfile",
        "connect_timeout",
        "target_session_attrs",
        "options",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
    }
)


@dataclass(eq=False)
class Subscription:
    """One waiter's interest in one occurrence: ``changed`` is set by a notification."""

    key: str
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class ChangeFeed:
    """One LISTEN connection for the waiters of one event loop."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._subscribers: dict[str, set[Subscription]] = {}
        self.listening = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def subscribe(self, occurrence_id: str) -> Iterator[Subscription]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        subscription = Subscription(occurrence_id.lower())
        self._subscribers.setdefault(subscription.key, set()).add(subscription)
        try:
            yield subscription
        finally:
            waiting = self._subscribers.get(subscription.key)
            if waiting is not None:
                waiting.discard(subscription)
                if not waiting:
                    del self._subscribers[subscription.key]

    async def ready(self, timeout: float) -> bool:
        """Whether the LISTEN is on (waiting up to ``timeout`` for it)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.listening.wait(), timeout)
        return self.listening.is_set()

    def _wake(self, key: str) -> None:
        for subscription in self._subscribers.get(key, ()):
            subscription.changed.set()

    def _wake_all(self) -> None:
        for waiting in self._subscribers.values():
            for subscription in waiting:
                subscription.changed.set()

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    backoff = 0.5
                    # Whatever changed while nobody listened: every waiter reads once.
                    self._wake_all()
                    async for notify in conn.notifies():
                        self._wake(notify.payload)
            except (psycopg.Error, OSError) as exc:
                _log.warning("longpoll.listen_failed", error=str(exc), retry_in=backoff)
            finally:
                if self.listening.is_set():
                    self.listening.clear()
                    self._wake_all()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)


# One feed per event loop: an ASGI server runs one loop per process; code that runs each
# request in a loop of its own (async_to_sync) gets a feed per request, closed with it.
_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ChangeFeed] = (
    weakref.WeakKeyDictionary()
)


def feed_for_running_loop() -> ChangeFeed | None:
    loop = asyncio.get_running_loop()
    feed = _feeds.get(loop)
    if feed is None:
        conninfo = listen_conninfo()
        if conninfo is None:
            return None
        feed = _feeds[loop] = ChangeFeed(conninfo)
    return feed


@dataclass
class _Answer:
    """An inner request's response, kept until it is sent or dropped."""

    messages: list[Message]

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    def header(self, name: bytes) -> bytes | None:
        return _header(self.messages[0], name)  # the start message carries the headers


class LongPollApp:
    """ASGI middleware: ``GET /api/v1/occurrences/{id}?wait=N`` waits on the event loop."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            return await self.app(scope, receive, send)
        match = _OCCURRENCE_PATH.fullmatch(scope["path"])
        if match is None:
            return await self.app(scope, receive, send)
        pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        waits = [value for name, value in pairs if name == "wait"]
        wait = parse_wait(waits[-1]) if waits else None
        if wait is None:
            return await self.app(scope, receive, send)
        inner = dict(scope)
        inner["query_string"] = urlencode([(n, v) for n, v in pairs if n != "wait"]).encode()
        await _LongPoll(self.app, inner, receive, send, match["id"], wait).run()


class _LongPoll:
    def __init__(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, key: str, wait: int
    ) -> None:
        self.app, self.scope, self.receive, self.send = app, scope, receive, send
        self.key, self.wait = key, wait
        self.gone = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        await self._read_request_body()
        watcher = loop.create_task(self._watch_disconnect())
        try:
            feed = feed_for_running_loop()
            if feed is None:
                answer = await self._poll(deadline, None)
            else:
                with feed.subscribe(self.key) as subscription:
                    await feed.ready(timeout=1.0)
                    # What happened before this point, the first read sees (a LISTEN that
                    # just connected wakes everyone, for what it may have missed).
                    subscription.changed.clear()
                    answer = await self._poll(deadline, (feed, subscription))
            if answer is not None and not self.gone.is_set():
                for message in answer.messages:
                    await self.send(message)
        finally:
            watcher.cancel()

    async def _poll(
        self, deadline: float, listening: tuple[ChangeFeed, Subscription] | None
    ) -> _Answer | None:
        client_etag = _header(self.scope, b"if-none-match")
        first = await self._ask(self.scope)
        etag = first.header(b"etag")
        if first.status not in (200, 304) or etag is None:
            return first  # an error (401, 404, 429...): nothing to wait for
        if first.status == 200 and client_etag is not None:
            return first  # the client's copy is already out of date
        unchanged = _with_header(self._reread(self.scope), b"if-none-match", etag)
        metrics.LONG_POLL_WAITING.inc()
        try:
            return await self._wait(deadline, listening, unchanged)
        finally:
            metrics.LONG_POLL_WAITING.dec()

    async def _wait(
        self,
        deadline: float,
        listening: tuple[ChangeFeed, Subscription] | None,
        unchanged: Scope,
    ) -> _Answer | None:
        loop = asyncio.get_running_loop()
        fallback = float(settings.LONG_POLL_FALLBACK_SECONDS)
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0 or self.gone.is_set():
                break
            if listening is not None and listening[0].listening.is_set():
                changed = listening[1].changed
                await self._sleep(changed, remaining)
                if self.gone.is_set() or not changed.is_set():
                    continue  # the client left, or the deadline came
                changed.clear()
            else:
                # No LISTEN (SQLite, or the connection is being re-made): read at intervals.
                await self._sleep(None, min(remaining, fallback))
                if self.gone.is_set() or deadline - loop.time() <= 0:
                    continue
            answer = await self._ask(unchanged)
            if answer.status != 304:
                return answer
        if self.gone.is_set():
            return None
        # The wait is over: the state as it is now (time alone can expire an approval).
        return await self._ask(self._reread(self.scope))

    @staticmethod
    def _reread(scope: Scope) -> Scope:
        """The reads after the first: the rate limit counted this long-poll once already
        (``approvals.api.base.RuntimeKeyThrottle``). A key of the scope, which no client can set."""
        return {**scope, REREAD_SCOPE_KEY: True}

    async def _sleep(self, changed: asyncio.Event | None, timeout: float) -> None:
        """Until ``changed`` is set, the client leaves, or ``timeout`` seconds pass."""
        waits = [asyncio.ensure_future(self.gone.wait())]
        if changed is not None:
            waits.append(asyncio.ensure_future(changed.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    async def _ask(self, scope: Scope) -> _Answer:
        """One ordinary request through Django, its response kept, not sent."""
        messages: list[Message] = []
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await self.gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            messages.append(message)

        metrics.LONG_POLL_READS.inc()
        await self.app(scope, receive, send)
        return _Answer(messages)

    async def _read_request_body(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                return
            if not message.get("more_body", False):
                return

    async def _watch_disconnect(self) -> None:
        while not self.gone.is_set():
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.gone.set()


def _header(scope: Scope | Message, name: bytes) -> bytes | None:
    """A header of a scope or a response start message (names are lower-case bytes)."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def _with_header(scope: Scope, name: bytes, value: bytes) -> Scope:
    changed = dict(scope)
    changed["headers"] = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != name]
    changed["headers"].append((name, value))
    return changed
