"""Runtime keys remembered for at most a second, so that an agent's calls do not read the
key's row on every request.

``approvals.access.runtime_keys.runtime_key_authenticate`` reads the key (and its tenant) from the
database and puts it here, under the SHA-256 of the raw key (the raw key itself is never kept); for
the next ``RUNTIME_KEY_CACHE_SECONDS`` (1 s, never more) this process's requests with that key take
it from here. So a key deactivated in the admin, in the console or by any UPDATE is refused (401) by
every process at the latest one second after the change committed: an entry is never older than the
second that follows its read. The process that deactivates a key through
``approvals.access.runtime_keys.runtime_key_deactivate`` forgets it at once.

The cache is per process (each gunicorn worker has its own) and bounded: it is emptied when
it holds ``MAX_ENTRIES`` keys. Unknown and inactive keys are never cached, so bogus keys
cannot fill it, and they keep costing their read.

A caller inside a database transaction always reads the row: it may have changed the key
itself (a test, a shell, a service), and what it reads must be what its transaction sees.
HTTP requests run outside transactions (no ``ATOMIC_REQUESTS``), so they use the cache.
"""

from __future__ import annotations

import copy
import threading
import time

from django.conf import settings
from django.db import connection

from approvals.models import RuntimeKey

# The guarantee: a deactivation takes effect within this many seconds, whatever the setting.
MAX_SECONDS = 1.0
MAX_ENTRIES = 10_000

_lock = threading.Lock()
# key_hash -> (monotonic time the entry expires, the key as read, with its tenant)
_entries: dict[str, tuple[float, RuntimeKey]] = {}


def now() -> float:
    """The clock entries expire by (``time.monotonic``). Tests replace it."""
    return time.monotonic()


def seconds() -> float:
    """How long an entry lives: ``RUNTIME_KEY_CACHE_SECONDS``, at most ``MAX_SECONDS``; 0
    turns the cache off."""
    return max(0.0, min(float(settings.RUNTIME_KEY_CACHE_SECONDS), MAX_SECONDS))


def _usable() -> bool:
    return seconds() > 0 and not connection.in_atomic_block


def get(key_hash: str) -> RuntimeKey | None:
    """The key with this hash as read less than ``seconds()`` ago, or None. The caller
    gets its own copy: what it sets on it stays in its request."""
    if not _usable():
        return None
    entry = _entries.get(key_hash)
    if entry is None:
        return None
    expires, key = entry
    if now() >= expires:
        with _lock:
            if _entries.get(key_hash) is entry:
                del _entries[key_hash]
        return None
    return copy.copy(key)


def put(key_hash: str, key: RuntimeKey, *, read_at: float) -> None:
    """Remember an active key read from the database at ``read_at`` (``now()`` taken
    before the read, so that the entry expires within ``seconds()`` of it)."""
    if not _usable() or not key.is_active:
        return
    entry = (read_at + seconds(), copy.copy(key))
    with _lock:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[key_hash] = entry


def touch(key_hash: str, last_used_at: object) -> None:
    """Record the ``last_used_at`` just written, so that the next requests see it fresh."""
    entry = _entries.get(key_hash)
    if entry is not None:
        entry[1].last_used_at = last_used_at  # type: ignore[assignment]


def forget(key_id: int | None = None) -> None:
    """Drop the key ``key_id`` (every key when None) from this process's cache."""
    with _lock:
        if key_id is None:
            _entries.clear()
            return
        for key_hash in [h for h, (_, k) in _entries.items() if k.pk == key_id]:
            del _entries[key_hash]
