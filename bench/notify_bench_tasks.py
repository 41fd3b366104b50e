"""The baseline task of ``bench/notify_bench.py``: a bare Celery task that only marks one
outbox row sent. The bench's worker imports it (``celery worker --include``); the console
never does."""

from __future__ import annotations

from celery import shared_task


# On the queue the notifications use, so that the same worker consumes both.
@shared_task(name="bench.notify.mark_sent", ignore_result=True, queue="callbacks")
def mark_sent(delivery_id: str) -> int:
    from django.utils import timezone

    from approvals.models import NotificationDelivery

    return NotificationDelivery.objects.filter(
        pk=delivery_id, state=NotificationDelivery.State.PENDING
    ).update(state=NotificationDelivery.State.DELIVERED, delivered_at=timezone.now())
