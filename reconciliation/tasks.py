"""Celery tasks. A task only decides which service to call; what a phase means lives in
``reconciliation.dispatch``."""

from __future__ import annotations

from datetime import timedelta

import structlog
from celery import shared_task
from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from approvals import broker
from approvals.models import Command
from reconciliation.dispatch import command_dispatch
from reconciliation.faults import crash_point
from reconciliation.models import AdapterInvocation

log = structlog.get_logger("reconciliation")


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def command_deliver(self, command_id: str) -> None:  # type: ignore[no-untyped-def]
    """Deliver one command. Acknowledged only after it returns: a worker that dies in the
    middle leaves the message to be delivered again, and the phases make that safe."""
    plan = command_dispatch(command_id=command_id, message_id=self.request.id or "")
    crash_point("after_record", command_id)
    if plan.retry_in is not None:
        enqueue(command_id, countdown=plan.retry_in)


@shared_task(ignore_result=True)
def commands_sweep() -> int:
    """The outbox sweep (Celery beat): deliver again any console-executed command still
    ``pending`` after the grace period (its announcement was lost between commit and
    enqueue), or still ``sending`` after its last call must have ended
    (``DISPATCH_STUCK_SENDING_SECONDS``: the outbound deadline and a margin), so its worker
    died: the redelivery's own rules decide what runs."""
    now = timezone.now()
    pending = Command.objects.filter(
        executed_by=Command.ExecutedBy.CONSOLE,
        state=Command.State.PENDING,
        updated_at__lt=now - timedelta(seconds=settings.DISPATCH_SWEEP_GRACE_SECONDS),
    )
    # No call can still be in flight: none started within the outbound deadline and its
    # margin (a delivery that called again under the same key started a new one).
    gone = now - timedelta(seconds=settings.DISPATCH_STUCK_SENDING_SECONDS)
    stuck = Command.objects.filter(
        executed_by=Command.ExecutedBy.CONSOLE,
        state=Command.State.SENDING,
        updated_at__lt=gone,
    ).exclude(
        Exists(AdapterInvocation.objects.filter(command=OuterRef("pk"), started_at__gte=gone))
    )
    ids = [str(pk) for pk in pending.values_list("pk", flat=True)[:500]]
    ids += [str(pk) for pk in stuck.values_list("pk", flat=True)[:500]]
    for command_id in ids:
        enqueue(command_id)
    if ids:
        log.info("dispatch.swept", commands=len(ids))
    return len(ids)


@shared_task(ignore_result=True)
def operations_escalate() -> int:
    """Escalate queue items nobody took within their tenant's threshold (Celery beat)."""
    from reconciliation.escalation import escalations_run

    return escalations_run()


def enqueue(command_id: str, *, countdown: float | None = None) -> bool:
    """Publish a delivery; False (logged) if the broker cannot be reached, in which case
    the sweep delivers the command later. Over a pooled connection (``approvals.broker``)."""
    try:
        broker.publish(command_deliver, (command_id,), countdown=countdown)
    except Exception:  # the broker's failures are many; none may fail the caller
        log.exception("dispatch.enqueue_failed", command_id=command_id)
        return False
    return True
