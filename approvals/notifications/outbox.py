"""The notification outbox: one ``NotificationEvent`` row, written in the transaction that
created the request (or escalated or decided it). After commit a drain is published unless
one is pending (``approvals.notifications.drain``): one task fans out many events; the sweep
fans out what a lost publish left (``approvals.notifications.tasks``)."""

from __future__ import annotations

import uuid

from django.db import transaction

from approvals.models import NotificationEvent
from approvals.notifications.tasks import fan_out_enqueue


def notification_event_create(
    *,
    tenant_id: int,
    occurrence_id: uuid.UUID | str,
    kind: str,
    outcome: str = "",
    decided_by: str = "",
) -> uuid.UUID:
    """Write the event (one INSERT) inside the caller's transaction; after commit a drain
    is published, unless one is pending that will find this event."""
    event_id = uuid.uuid4()
    NotificationEvent.objects.create(
        id=event_id,
        tenant_id=tenant_id,
        occurrence_id=occurrence_id,
        kind=kind,
        outcome=outcome,
        decided_by=decided_by,
    )
    transaction.on_commit(lambda: fan_out_enqueue(event_id))
    return event_id
