"""The notifications' Celery tasks, and publishing them. A task only decides which service
to call (``fanout``, ``delivery``)."""

from __future__ import annotations

import uuid

import structlog
from celery import shared_task
from celery.signals import worker_process_shutdown

from approvals import broker
from approvals.notifications import mailer
from approvals.notifications.delivery import (
    deliver,
    deliveries_due,
    digests_send,
    event_dispatch,
    events_due,
)
from approvals.notifications.fanout import fan_out

log = structlog.get_logger("approvals.notifications")


@shared_task(name="approvals.notifications.fan_out", ignore_result=True)
def notification_fan_out(event_id: str) -> int:
    """An outbox event into its deliveries: a small audience's sent here, a larger one's
    each published (``event_dispatch``); a failed send's retry published with its backoff."""

    done = event_dispatch(event_id)
    for delivery_id in done.publish:
        notification_enqueue(delivery_id)
    for delivery_id, attempt in done.sent:
        if attempt.retry_in is not None:
            notification_enqueue(delivery_id, countdown=attempt.retry_in)
    return len(done.publish) + len(done.sent)


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


def fan_out_enqueue(event_id: uuid.UUID | str) -> bool:
    """Publish the event's fan-out; False (logged) when the broker is unreachable, in which
    case the sweep fans it out later."""
    return _publish(notification_fan_out, str(event_id))


def notification_enqueue(delivery_id: uuid.UUID | str, *, countdown: float | None = None) -> bool:
    return _publish(notification_deliver, str(delivery_id), countdown)


@worker_process_shutdown.connect
def _close_mail_connection(**_: object) -> None:
    """The process's SMTP connection (``mailer``) says QUIT rather than vanish."""
    mailer.close()
