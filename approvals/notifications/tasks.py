"""The notifications' Celery tasks, and publishing them. A task only decides which service
to call (``fanout``, ``delivery``)."""

from __future__ import annotations

import secrets
import uuid

import structlog
from celery import shared_task
from celery.signals import worker_process_shutdown
from django.conf import settings

from approvals import broker
from approvals.notifications import mailer
from approvals.notifications.delivery import (
    deliver,
    deliveries_due,
    digests_send,
    event_dispatch,
    events_due,
)
from approvals.notifications.drain import drain_started, drain_wanted, events_to_drain
from approvals.notifications.fanout import fan_out

log = structlog.get_logger("approvals.notifications")

DRAIN_TASK = "approvals.notifications.drain"


@shared_task(name=DRAIN_TASK, ignore_result=True)
def notifications_drain() -> int:
    """The outbox's events, a batch at a time, each dispatched as ``notification_fan_out``
    does, until none is left or ``NOTIFY_DRAIN_MAX_BATCHES`` batches' worth were tried
    (then the next drain is published). The marker is deleted first, before the first
    read: why no event is missed is said in ``approvals.notifications.drain``.

    Drains run side by side (one per worker process while requests keep coming) and read
    the same oldest events: each starts at a random place in its batch, and reads a fresh
    batch at the first event it finds taken, so that two drains seldom try the same event
    (each always read every event of one batch, half of them for nothing, when they started
    at its beginning)."""

    drain_started()
    delivered = tried = 0
    most = settings.NOTIFY_DRAIN_BATCH * settings.NOTIFY_DRAIN_MAX_BATCHES
    failed: set[str] = set()  # not tried again by this drain: the sweep's
    while tried < most:
        batch = events_to_drain(min(settings.NOTIFY_DRAIN_BATCH, most - tried), failed)
        if not batch:
            log.info("notification.drained", deliveries=delivered, events=tried)
            return delivered
        first = secrets.randbelow(len(batch))
        for event_id in batch[first:] + batch[:first]:
            tried += 1
            try:
                done = _dispatch(event_id)
            except Exception:  # one event's failure must not hold up the others
                log.exception("notification.fan_out_failed", event_id=event_id)
                failed.add(event_id)
                continue
            if done < 0:
                break  # another drain is in this batch: a fresh one
            delivered += done
    log.info("notification.drained", deliveries=delivered, events=tried, more=True)
    drain_enqueue()
    return delivered


@shared_task(name="approvals.notifications.fan_out", ignore_result=True)
def notification_fan_out(event_id: str) -> int:
    """One event's fan-out (what a commit published before the drain; a message of that
    kind still queued is served): its deliveries, a small audience's sent here."""
    return max(_dispatch(event_id), 0)


def _dispatch(event_id: str) -> int:
    """An outbox event into its deliveries: a small audience's sent here, a larger one's
    each published (``event_dispatch``); a failed send's retry published with its backoff.
    The deliveries attempted or published; -1 when the event was not fanned out here (done
    already, or held by another task)."""

    done = event_dispatch(event_id)
    for delivery_id in done.publish:
        notification_enqueue(delivery_id)
    for delivery_id, attempt in done.sent:
        if attempt.retry_in is not None:
            notification_enqueue(delivery_id, countdown=attempt.retry_in)
    return len(done.publish) + len(done.sent) if done.fanned else -1


@shared_task(name="approvals.notifications.deliver", ignore_result=True)
def notification_deliver(delivery_id: str) -> str:
    """One attempt at one notification; the next published with its backoff."""

    attempt = deliver(delivery_id)
    if attempt.retry_in is not None:
        notification_enqueue(delivery_id, countdown=attempt.retry_in)
    return attempt.outcome


@shared_task(name="approvals.notifications.sweep", ignore_result=True)
def notifications_sweep() -> int:
    """What a lost publish left (Celery beat): events not fanned out, deliveries due (those
    quiet hours deferred too)."""

    count = 0
    for event_id in events_due():
        for delivery_id in fan_out(event_id):
            notification_enqueue(delivery_id)
            count += 1
    for delivery_id in deliveries_due():
        attempt = deliver(delivery_id)
        count += 1
        if attempt.retry_in is not None:
            notification_enqueue(delivery_id, countdown=attempt.retry_in)
    return count


@shared_task(name="approvals.notifications.digests", ignore_result=True)
def notifications_digest() -> int:
    """The digests whose period has passed (Celery beat)."""

    made = digests_send()
    for delivery_id in made:
        notification_enqueue(delivery_id)
    return len(made)


def _publish(task: object, arg: str, countdown: float | None = None) -> bool:
    try:
        broker.publish(task, (arg,), countdown=countdown)  # type: ignore[arg-type]
    except Exception:  # the broker's failures are many; none may fail the caller
        log.exception("notification.enqueue_failed", id=arg)
        return False
    return True


def drain_enqueue() -> bool:
    """Publish a drain unless one is pending (``drain_wanted``); False (logged) when the
    broker is unreachable: the marker is deleted again, and the sweep fans out what waits."""
    if not drain_wanted():
        return True
    try:
        broker.publish(notifications_drain, ())
    except Exception:  # the broker's failures are many; none may fail the caller
        log.exception("notification.drain_enqueue_failed")
        drain_started()
        return False
    return True


def fan_out_enqueue(event_id: uuid.UUID | str) -> bool:
    """The event's fan-out, published after its commit: a drain, unless one is pending
    (``drain_enqueue``; the event is then the pending drain's). ``event_id`` is kept for
    the callers: the drain finds the event itself."""
    return drain_enqueue()


def notification_enqueue(delivery_id: uuid.UUID | str, *, countdown: float | None = None) -> bool:
    return _publish(notification_deliver, str(delivery_id), countdown)


@worker_process_shutdown.connect
def _close_mail_connection(**_: object) -> None:
    """The process's SMTP connection (``mailer``) says QUIT rather than vanish."""
    mailer.close()
