"""The rate limit's counters in Redis (``API_RATE_LIMIT_REDIS_URL``), so that an API request
within its limit writes nothing to the database (``approvals.access.ratelimit`` decides
what a count means; this module only counts).

One Redis key per caller and window, ``<prefix>:<kind>:<id>:<window start>``, incremented
by a Lua script that also gives it its expiry: ``INCR`` and ``EXPIRE`` are one atomic step
and one round trip, so every web process shares one exact count and no key outlives its
window by more than ``2 x window + 60 s`` (long enough for an ended window's report to
read it). The script sets the expiry of a key that has none, not only of a key it has just
created, so a counter left without one (written by hand, or by an older script) gets it at
its next count. The same script says whether the caller has counter rows in the database
that a later window must report (``<prefix>:<kind>:<id>:rows``, set by ``rows_written``);
that flag expires too, after ``ROWS_FLAG_SECONDS``. Every key this module writes expires.

When Redis does not answer (refused, or not within ``SOCKET_TIMEOUT``), ``count`` returns
None and the caller counts in the database instead; this process then leaves Redis alone
for ``RETRY_SECONDS`` rather than wait on it with every request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
import structlog
from django.conf import settings

SOCKET_TIMEOUT = 0.25
RETRY_SECONDS = 5.0
# The "rows to report" flag only spares a later window's first request a DELETE that finds
# nothing; rows still waiting when it expires are reported by the beat task (once a
# window), as they would be anyway. A day outlives any window and any beat outage worth
# the name, and bounds what a key that went quiet leaves in Redis.
ROWS_FLAG_SECONDS = 24 * 3600

# KEYS[1] the window's counter, KEYS[2] the caller's "rows to report" flag; ARGV[1] the
# counter's lifetime in seconds. Returns {requests so far, 1 if the flag is set}. TTL is
# -1 for a key without an expiry: a new counter, or one something left without it.
_COUNT = """
local requests = redis.call('INCR', KEYS[1])
if redis.call('TTL', KEYS[1]) == -1 then
    redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return {requests, redis.call('EXISTS', KEYS[2])}
"""

_log = structlog.get_logger("approvals.ratelimit")
_lock = threading.Lock()
_clients: dict[str, tuple[redis.Redis, Any]] = {}
# URL -> monotonic time before which this process does not ask that Redis again.
_down_until: dict[str, float] = {}


def enabled() -> bool:
    return bool(settings.API_RATE_LIMIT_REDIS_URL)


def _client() -> tuple[redis.Redis, Any]:
    url = settings.API_RATE_LIMIT_REDIS_URL
    found = _clients.get(url)
    if found is None:
        with _lock:
            found = _clients.get(url)
            if found is None:
                client = redis.Redis.from_url(
                    url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
                )
                found = _clients[url] = (client, client.register_script(_COUNT))
    return found


def _key(kind: str, caller_id: int, window_start: int | None = None) -> str:
    tail = "rows" if window_start is None else str(window_start)
    return f"{settings.API_RATE_LIMIT_REDIS_PREFIX}:{kind}:{caller_id}:{tail}"


def _available() -> bool:
    return time.monotonic() >= _down_until.get(settings.API_RATE_LIMIT_REDIS_URL, 0.0)


def _failed(exc: Exception) -> None:
    if _available():
        _log.warning("rate_limit_redis_unavailable", error=str(exc), retry_in=RETRY_SECONDS)
    _down_until[settings.API_RATE_LIMIT_REDIS_URL] = time.monotonic() + RETRY_SECONDS


def count(
    kind: str, caller_id: int, window_start: int, window_seconds: int
) -> tuple[int, bool] | None:
    """Count one request of the caller in the window: (requests so far, whether rows of
    the caller wait in the database to be reported), or None if Redis is unavailable."""
    if not _available():
        return None
    _, script = _client()
    try:
        requests, rows = script(
            keys=[_key(kind, caller_id, window_start), _key(kind, caller_id)],
            args=[2 * window_seconds + 60],
        )
    except redis.RedisError as exc:
        _failed(exc)
        return None
    return int(requests), bool(rows)


def requests_in(kind: str, caller_id: int, window_starts: Iterable[int]) -> list[int | None]:
    """The count of each window, None where Redis no longer (or cannot) say."""
    starts = list(window_starts)
    if not starts or not _available():
        return [None] * len(starts)
    client, _ = _client()
    try:
        values = client.mget([_key(kind, caller_id, start) for start in starts])
    except redis.RedisError as exc:
        _failed(exc)
        return [None] * len(starts)
    return [None if value is None else int(value) for value in values]


def rows_written(kind: str, caller_id: int) -> None:
    """Note that the caller has counter rows in the database, which the first request of a
    later window reports (the beat task reports them anyway)."""
    if not _available():
        return
    client, _ = _client()
    try:
        client.set(_key(kind, caller_id), 1, ex=ROWS_FLAG_SECONDS)
    except redis.RedisError as exc:
        _failed(exc)


def rows_reported(kind: str, caller_id: int) -> None:
    if not _available():
        return
    client, _ = _client()
    try:
        client.delete(_key(kind, caller_id))
    except redis.RedisError as exc:
        _failed(exc)
