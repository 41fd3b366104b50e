"""Reads for the pages: a reviewer's unread notifications, and their recent ones."""

from __future__ import annotations

import uuid

from django.utils import timezone

from approvals.models import Channel, NotificationDelivery


def unread_count(user_id: int | None) -> int:
    """The header's count: requests told to the reviewer in the console, not yet opened."""
    if user_id is None:
        return 0
    return NotificationDelivery.objects.filter(
        user_id=user_id, channel=Channel.CONSOLE, read_at__isnull=True
    ).count()


def recent(user_id: int | None, limit: int = 20) -> list[NotificationDelivery]:
    if user_id is None:
        return []
    return list(
        NotificationDelivery.objects.filter(user_id=user_id, channel=Channel.CONSOLE).order_by(
            "-created_at"
        )[:limit]
    )


def notifications_read(*, user_id: int | None, occurrence_id: uuid.UUID | str | None = None) -> int:
    """Mark the reviewer's console notifications read: those of one request (its review
    page was opened), or all of them."""
    if user_id is None:
        return 0
    rows = NotificationDelivery.objects.filter(
        user_id=user_id, channel=Channel.CONSOLE, read_at__isnull=True
    )
    if occurrence_id is not None:
        rows = rows.filter(event__occurrence_id=occurrence_id)
    return rows.update(read_at=timezone.now())
