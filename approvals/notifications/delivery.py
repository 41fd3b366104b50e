"""Sending notifications through the outbox mechanism callbacks use, and the digests."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models import (
    Channel,
    NotificationAttempt,
    NotificationDelivery,
    NotificationEvent,
    NotificationPreference,
)
from approvals.notifications.channels import DIGEST, send
from approvals.notifications.fanout import fan_out_rows
from approvals.notifications.preferences import quiet_until
from approvals.outbound.outbox import Attempt, attempt_leased, attempt_once, rows_due

# Held rows wait for their digest: never sent one by one.
_NOT_HELD = Q(held=False)


def deliver(delivery_id: str) -> Attempt:
    """One attempt at one notification (``approvals.outbound.outbox``)."""
    return attempt_once(
        rows=NotificationDelivery,
        attempts=NotificationAttempt,
        pk=delivery_id,
        send=send,
        max_attempts=settings.NOTIFY_MAX_ATTEMPTS,
        backoff_seconds=settings.NOTIFY_RETRY_BACKOFF_SECONDS,
        related=("user", "group"),
        due=_NOT_HELD,
    )


class Dispatched(NamedTuple):
    """What ``event_dispatch`` did: the deliveries it attempted itself, with each attempt,
    and those left for a task each (to publish)."""

    sent: list[tuple[str, Attempt]]
    publish: list[str]
    fanned: bool = True  # False: nothing done, the event was done already or held


def event_dispatch(event_id: str) -> Dispatched:
    """Fan one event out and, when at most ``NOTIFY_INLINE_DELIVERIES`` deliveries are due
    now (a small audience: the common case), attempt them here rather than through a
    ``deliver`` message each: written leased by the fan-out, each sent once and its attempt
    recorded as any other (``attempt_leased``). A failure is retried as ever: the caller
    publishes the retry with its backoff. A larger audience is left to a task each."""
    fanned = fan_out_rows(event_id, lease_up_to=settings.NOTIFY_INLINE_DELIVERIES)
    if not fanned.leased:
        return Dispatched([], [str(row.pk) for row in fanned.due], fanned.found)
    sent = [
        (
            str(row.pk),
            attempt_leased(
                row=row,
                attempts=NotificationAttempt,
                send=send,
                max_attempts=settings.NOTIFY_MAX_ATTEMPTS,
                backoff_seconds=settings.NOTIFY_RETRY_BACKOFF_SECONDS,
            ),
        )
        for row in fanned.due
    ]
    return Dispatched(sent, [])


def deliveries_due(limit: int = 500) -> list[str]:
    """Notifications whose time has come (their task was lost, or quiet hours are over)."""
    return rows_due(
        NotificationDelivery,
        grace_seconds=settings.NOTIFY_SWEEP_GRACE_SECONDS,
        limit=limit,
        due=_NOT_HELD,
    )


def events_due(limit: int = 200) -> list[str]:
    """Outbox events nobody fanned out (their task was lost)."""
    before = timezone.now() - timedelta(seconds=settings.NOTIFY_SWEEP_GRACE_SECONDS)
    return [
        str(pk)
        for pk in NotificationEvent.objects.filter(
            fanned_out_at__isnull=True, created_at__lte=before
        )
        .order_by("created_at")
        .values_list("pk", flat=True)[:limit]
    ]


def digests_send(now: datetime | None = None) -> list[str]:
    """For each reviewer who chose a digest and whose period has passed (and who is not in
    quiet hours): one e-mail carrying every held notification, which are then marked as
    delivered by it. Returns the new digests' ids, to send."""
    now = now or timezone.now()
    made = []
    prefs = NotificationPreference.objects.filter(
        channel=Channel.EMAIL, mode=NotificationPreference.Mode.DIGEST
    )
    for pref in prefs:
        if pref.last_digest_at and now < pref.last_digest_at + timedelta(
            minutes=pref.digest_minutes
        ):
            continue
        if quiet_until(pref, now) is not None:
            continue
        with transaction.atomic():
            held = list(
                NotificationDelivery.objects.select_for_update(skip_locked=True)
                .filter(
                    user_id=pref.user_id,
                    channel=Channel.EMAIL,
                    held=True,
                    state=NotificationDelivery.State.PENDING,
                )
                .order_by("created_at")
            )
            if not held:
                continue
            digest = NotificationDelivery.objects.create(
                tenant_id=held[0].tenant_id,
                channel=Channel.EMAIL,
                user_id=pref.user_id,
                body={"event": DIGEST, "items": [row.body for row in held]},
                next_attempt_at=now,
            )
            NotificationDelivery.objects.filter(pk__in=[row.pk for row in held]).update(
                state=NotificationDelivery.State.DELIVERED, delivered_at=now, digest=digest
            )
            NotificationPreference.objects.filter(pk=pref.pk).update(last_digest_at=now)
        made.append(str(digest.pk))
    return made
