"""Draining the notification outbox with one task for many events, instead of one task per
event: the well-known debounced drain of a transactional outbox.

A commit that wrote an event publishes ``approvals.notifications.drain`` only if no drain
is pending: it sets a marker with ``cache.add`` (atomic "set if absent", with a TTL) in a
cache every process shares (``settings.NOTIFY_DRAIN_CACHE``: Redis), and publishes only
when the add succeeded (``drain_wanted``). The drain task first deletes the marker
(``drain_started``), then fans out the un-fanned events a batch at a time
(``events_to_drain``), each through ``event_dispatch`` as a single event's task does.

**No event is missed.** Take an event committed, then its publisher's ``add``:

- the add succeeded: this publisher publishes a drain, which scans after it starts, so
  after the commit;
- the add failed: the marker was there, set by a publisher whose drain had not yet deleted
  it (the drain deletes it *before* its scan). So that drain's delete comes after this add,
  which comes after the commit: its scan sees the event.

What is left is what no drain runs for: a publish that failed (the marker is deleted again
at once, so the next commit publishes, and the beat sweep fans out what is older than its
grace), a drain message lost in the broker (the marker expires after
``NOTIFY_DRAIN_MARKER_SECONDS``; the sweep meanwhile), a fan-out that failed (the sweep
again). A drain that takes its last batch (``NOTIFY_DRAIN_MAX_BATCHES``) and still finds
events publishes the next drain the same way.

Without a shared cache (the demo's filesystem broker, no Redis) the cache is Django's dummy
one, whose ``add`` always succeeds: every commit publishes a drain, one task an event as
before, which finds its event (or nothing, when an earlier drain took it).
"""

from __future__ import annotations

from collections.abc import Collection

import structlog
from django.conf import settings
from django.core.cache import caches
from django.db import transaction

from approvals.models import NotificationEvent

log = structlog.get_logger("approvals.notifications")

MARKER = "drain-pending"


def drain_wanted() -> bool:
    """Whether this caller is to publish a drain: True when it set the marker (none was
    pending), or when the cache cannot be reached (a drain too many is harmless, a missing
    one is not)."""
    try:
        return bool(
            caches[settings.NOTIFY_DRAIN_CACHE].add(
                MARKER, 1, timeout=settings.NOTIFY_DRAIN_MARKER_SECONDS
            )
        )
    except Exception:  # the cache's failures are many; none may lose a drain
        log.exception("notification.drain_marker_failed")
        return True


def drain_started() -> None:
    """Delete the marker (a drain starting, before its scan; or a publish that failed, so
    that the next commit publishes again)."""
    try:
        caches[settings.NOTIFY_DRAIN_CACHE].delete(MARKER)
    except Exception:  # it expires after its TTL; the sweep covers the wait meanwhile
        log.exception("notification.drain_marker_failed")


def events_to_drain(limit: int, skip: Collection[str] = ()) -> list[str]:
    """Up to ``limit`` events nobody fanned out yet, oldest first, leaving out those another
    drain is fanning out at this moment (``FOR UPDATE SKIP LOCKED``; the lock ends with the
    read: each event is locked again by its fan-out) and ``skip``, those this drain tried
    already and left (a fan-out that failed, an event another drain held)."""
    with transaction.atomic():
        found = (
            NotificationEvent.objects.select_for_update(skip_locked=True)
            .filter(fanned_out_at__isnull=True)
            .exclude(pk__in=list(skip))
            .order_by("created_at")
            .values_list("pk", flat=True)[:limit]
        )
        return [str(pk) for pk in found]
