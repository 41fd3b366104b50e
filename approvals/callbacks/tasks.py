"""The callbacks' Celery tasks, and publishing one. A task only decides which service to
call; the names stay those of ``approvals.tasks``, where the tasks were first declared
(queued messages and the beat schedule name them)."""

from __future__ import annotations

import uuid

import structlog
from celery import shared_task

from approvals import broker
from approvals.callbacks.delivery import deliver, deliveries_due

log = structlog.get_logger("approvals.callbacks")


@shared_task(name="approvals.tasks.callback_deliver", ignore_result=True)
def callback_deliver(delivery_id: str) -> str:
    """One attempt at pushing one decision to a runtime's callback URL; the next one
    published with its backoff when it must be tried again."""
    attempt = deliver(delivery_id)
    if attempt.retry_in is not None:
        callback_enqueue(delivery_id, countdown=attempt.retry_in)
    return attempt.outcome


@shared_task(name="approvals.tasks.callbacks_sweep", ignore_result=True)
def callbacks_sweep() -> int:
    """Push what was never pushed: deliveries whose task was lost (Celery beat)."""
    due = deliveries_due()
    for delivery_id in due:
        attempt = deliver(delivery_id)
        if attempt.retry_in is not None:
            callback_enqueue(delivery_id, countdown=attempt.retry_in)
    return len(due)


def callback_enqueue(delivery_id: uuid.UUID | str, *, countdown: float | None = None) -> bool:
    """Publish the delivery's task; False (logged) if the broker cannot be reached, in which
    case the sweep (``callbacks_sweep``, Celery beat) sends it later."""
    try:
        broker.publish(callback_deliver, (str(delivery_id),), countdown=countdown)
    except Exception:  # the broker's failures are many; none may fail the caller
        log.exception("callback.enqueue_failed", delivery_id=str(delivery_id))
        return False
    return True
