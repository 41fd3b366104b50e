"""Reads for the pages: a reviewer's unread notifications (counted in the header), and
their recent ones."""

from __future__ import annotations

import uuid

from django.db.models import Count, IntegerField, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from approvals.models import Channel, NotificationDelivery


def _unread(user_id: int) -> QuerySet[NotificationDelivery]:
    """Requests told to the reviewer in the console, not yet opened: the header's count."""
    return NotificationDelivery.objects.filter(
        user_id=user_id, channel=Channel.CONSOLE, read_at__isnull=True
    )


# The header's count as a subquery of the read every page makes (the user's memberships,
# ``approvals.web.selectors.access``), so that the header costs no query of its own. The
# channel is written into the text: the partial index ``notification_unread`` then serves it.
UNREAD_COUNT_SQL = f"""(SELECT COUNT(*) FROM approvals_notificationdelivery d
  WHERE d.user_id = %s AND d.channel = '{Channel.CONSOLE.value}' AND d.read_at IS NULL)"""  # noqa: S608


def unread_count_subquery(user_id: int) -> Coalesce:
    """The ORM twin of ``UNREAD_COUNT_SQL``, to annotate a queryset with."""
    counted = _unread(user_id).order_by().values("user_id").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted), Value(0), output_field=IntegerField())


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
    rows = _unread(user_id)
    if occurrence_id is not None:
        rows = rows.filter(event__occurrence_id=occurrence_id)
    return rows.update(read_at=timezone.now())
