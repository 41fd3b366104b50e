"""An event into its deliveries: who is told, on which channel, and when."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from approvals.models import (
    Channel,
    NotificationDelivery,
    NotificationEvent,
    NotificationPreference,
    Occurrence,
    ReviewerGroup,
)
from approvals.notifications.content import message
from approvals.notifications.preferences import (
    default_preference,
    preferences_of,
    quiet_until,
)
from approvals.routing.rules import routed, tenant_reviewer_ids

Mode = NotificationPreference.Mode


def _audience(
    event: NotificationEvent, routed_by_id: int | None
) -> tuple[list[int], list[ReviewerGroup]]:
    """The reviewers told personally and the groups whose channels are told."""
    route = routed(routed_by_id)
    if event.kind == NotificationEvent.Kind.REQUESTED:
        if route.version is None:
            return tenant_reviewer_ids(event.tenant_id), []
        groups = route.groups
    elif event.kind == NotificationEvent.Kind.ESCALATED:
        groups = [route.fallback] if route.fallback is not None else []
    else:  # decided: the groups' channels hear the outcome, nobody is mailed
        return [], route.groups
    users = sorted({m for g in groups for m in g.members.values_list("pk", flat=True)})
    return users, groups


def _personal(
    event: NotificationEvent, body: dict[str, object], user_ids: list[int], now: datetime
) -> list[NotificationDelivery]:
    prefs = preferences_of(user_ids)
    emails = dict(
        get_user_model().objects.filter(pk__in=user_ids, is_active=True).values_list("pk", "email")
    )
    rows = []
    for user_id in user_ids:
        if user_id not in emails:
            continue  # deactivated
        console = prefs.get((user_id, Channel.CONSOLE)) or default_preference(
            user_id, Channel.CONSOLE
        )
        if console.mode != Mode.NONE:
            rows.append(
                NotificationDelivery(
                    tenant_id=event.tenant_id,
                    event=event,
                    channel=Channel.CONSOLE,
                    user_id=user_id,
                    body=body,
                    state=NotificationDelivery.State.DELIVERED,
                    next_attempt_at=now,
                    delivered_at=now,
                )
            )
        email = prefs.get((user_id, Channel.EMAIL)) or default_preference(user_id, Channel.EMAIL)
        if email.mode == Mode.NONE or not emails[user_id]:
            continue
        rows.append(
            NotificationDelivery(
                tenant_id=event.tenant_id,
                event=event,
                channel=Channel.EMAIL,
                user_id=user_id,
                body=body,
                held=email.mode == Mode.DIGEST,
                # Quiet hours defer it: the sweep sends it once they are over.
                next_attempt_at=quiet_until(email, now) or now,
            )
        )
    return rows


def _group_rows(
    event: NotificationEvent, body: dict[str, object], groups: list[ReviewerGroup], now: datetime
) -> list[NotificationDelivery]:
    rows = []
    for group in groups:
        channels = []
        if group.slack_webhook_encrypted:
            channels.append(Channel.SLACK)
        if group.webhook_url and group.webhook_secret_encrypted:
            channels.append(Channel.WEBHOOK)
        rows += [
            NotificationDelivery(
                tenant_id=event.tenant_id,
                event=event,
                channel=channel,
                group=group,
                body=body,
                next_attempt_at=now,
            )
            for channel in channels
        ]
    return rows


def fan_out(event_id: uuid.UUID | str) -> list[str]:
    """Turn one outbox event into its deliveries, once (a second call, or the sweep meeting
    a task that is running, changes nothing). Returns the ids of the deliveries due now."""
    with transaction.atomic():
        event = (
            NotificationEvent.objects.select_for_update(skip_locked=True)
            .filter(pk=event_id, fanned_out_at__isnull=True)
            .first()
        )
        if event is None:
            return []
        now = timezone.now()
        routed_by_id = (
            Occurrence.objects.filter(pk=event.occurrence_id)
            .values_list("routed_by_id", flat=True)
            .first()
        )
        users, groups = _audience(event, routed_by_id)
        body = message(event)
        rows = _personal(event, body, users, now) + _group_rows(event, body, groups, now)
        NotificationDelivery.objects.bulk_create(rows)
        NotificationEvent.objects.filter(pk=event.pk).update(fanned_out_at=now)
    return [
        str(row.pk)
        for row in rows
        if row.state == NotificationDelivery.State.PENDING
        and not row.held
        and row.next_attempt_at <= now
    ]
