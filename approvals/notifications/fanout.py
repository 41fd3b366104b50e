"""An event into its deliveries: who is told, on which channel, and when."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from approvals.access.tenancy import username_of
from approvals.canonical.confusables import same_person
from approvals.models import (
    Channel,
    Membership,
    NotificationDelivery,
    NotificationEvent,
    NotificationPreference,
    Occurrence,
    Proposal,
    ReviewerGroup,
)
from approvals.notifications.content import message
from approvals.notifications.preferences import (
    default_preference,
    preferences_of,
    quiet_until,
)
from approvals.outbound.outbox import LEASE
from approvals.routing.rules import audience

Mode = NotificationPreference.Mode


def _locked_event(event_id: uuid.UUID | str) -> NotificationEvent | None:
    """The event, locked, if nobody fanned it out yet, with everything its message and its
    audience are read from, in one query: the occurrence, its tool and tenant, the rule
    version that routed it and that version's fallback group, and the current proposal's
    canonical action, digest and version (``proposal_*``)."""
    # No ordering: there is one current proposal, and the model's default ordering would
    # join the occurrence and sort, three times over.
    current = Proposal.objects.filter(
        occurrence_id=OuterRef("occurrence_id"), is_current=True
    ).order_by()
    return (
        NotificationEvent.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related(
            "occurrence__tool", "occurrence__tenant", "occurrence__routed_by__fallback_group"
        )
        .annotate(
            proposal_action=Subquery(current.values("canonical_action")[:1]),
            proposal_digest=Subquery(current.values("action_digest")[:1]),
            proposal_version=Subquery(current.values("version")[:1]),
        )
        .filter(pk=event_id, fanned_out_at__isnull=True)
        .first()
    )


def _current_proposal(event: Any) -> Proposal | None:
    if event.proposal_digest is None:
        return None
    return Proposal(
        canonical_action=event.proposal_action,
        action_digest=event.proposal_digest,
        version=event.proposal_version,
    )


def _audience(
    event: NotificationEvent, occurrence: Occurrence
) -> tuple[list[Any], list[ReviewerGroup]]:
    """The reviewers told personally (active users) and the groups whose channels are
    told; an escalation with no fallback group tells the tenant's admins. The requester,
    when they name one of those reviewers as self-approval compares them
    (``same_person``), is not told of their own request."""
    version = occurrence.routed_by
    if event.kind == NotificationEvent.Kind.REQUESTED:
        if version is None:
            users = audience(tenant_id=event.tenant_id, group_ids=None)
            return _not_the_requester(users, occurrence), []
        groups = list(version.groups.order_by("name"))
    elif event.kind == NotificationEvent.Kind.ESCALATED:
        fallback = version.fallback_group if version is not None else None
        if fallback is None:
            # Nothing may wait for ever unseen: with no fallback group (or no rule), the
            # tenant's admins are told, each by console and e-mail as they chose.
            users = audience(tenant_id=event.tenant_id, group_ids=None, role=Membership.Role.ADMIN)
            return _not_the_requester(users, occurrence), []
        groups = [fallback]
    else:  # decided: the groups' channels hear the outcome, nobody is mailed
        return [], list(version.groups.order_by("name")) if version is not None else []
    if not groups:
        return [], []
    users = audience(tenant_id=event.tenant_id, group_ids=[g.pk for g in groups])
    return _not_the_requester(users, occurrence), groups


def _not_the_requester(users: list[Any], occurrence: Occurrence) -> list[Any]:
    if not occurrence.requested_by:
        return users
    return [
        user
        for user in users
        if not same_person(occurrence.requested_by, username_of(user), user.email or "")
    ]


def _personal(
    event: NotificationEvent, body: dict[str, object], users: list[Any], now: datetime
) -> list[NotificationDelivery]:
    prefs = preferences_of([user.pk for user in users])
    rows = []
    for user in users:
        console = prefs.get((user.pk, Channel.CONSOLE)) or default_preference(
            user.pk, Channel.CONSOLE
        )
        if console.mode != Mode.NONE:
            rows.append(
                NotificationDelivery(
                    tenant_id=event.tenant_id,
                    event=event,
                    channel=Channel.CONSOLE,
                    user=user,
                    body=body,
                    state=NotificationDelivery.State.DELIVERED,
                    next_attempt_at=now,
                    delivered_at=now,
                )
            )
        email = prefs.get((user.pk, Channel.EMAIL)) or default_preference(user.pk, Channel.EMAIL)
        if email.mode == Mode.NONE or not user.email:
            continue
        rows.append(
            NotificationDelivery(
                tenant_id=event.tenant_id,
                event=event,
                channel=Channel.EMAIL,
                user=user,
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
        if group.slack_bot_token_encrypted and group.slack_channel_id:
            channels.append(Channel.SLACK_APP)
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


class Fanned(NamedTuple):
    """What a fan-out wrote: the deliveries due now (not held for a digest, not deferred
    by quiet hours), and whether they were written leased, for the caller to send;
    ``found`` False when the event was not fanned out here (done already, or held by
    another task)."""

    due: list[NotificationDelivery]
    leased: bool
    found: bool = True


def fan_out_rows(event_id: uuid.UUID | str, *, lease_up_to: int = 0) -> Fanned:
    """Turn one outbox event into its deliveries, once (a second call, or the sweep meeting
    a task that is running, changes nothing). When at most ``lease_up_to`` of them are due
    now, they are written leased (``leased_until``) in the same transaction, so that the
    caller sends them itself (``approvals.outbound.outbox.attempt_leased``) and nobody else
    does until the lease runs out; otherwise they are written free, for their own tasks."""
    with transaction.atomic():
        event = _locked_event(event_id)
        if event is None:
            return Fanned([], False, found=False)
        now = timezone.now()
        occurrence = event.occurrence
        users, groups = _audience(event, occurrence)
        body = message(event, occurrence, _current_proposal(event))
        rows = _personal(event, body, users, now) + _group_rows(event, body, groups, now)
        due = [
            row
            for row in rows
            if row.state == NotificationDelivery.State.PENDING
            and not row.held
            and row.next_attempt_at <= now
        ]
        leased = 0 < len(due) <= lease_up_to
        for row in due if leased else []:
            row.leased_until = now + LEASE
        NotificationDelivery.objects.bulk_create(rows)
        NotificationEvent.objects.filter(pk=event.pk).update(fanned_out_at=now)
    return Fanned(due, leased)


def fan_out(event_id: uuid.UUID | str) -> list[str]:
    """Fan the event out (``fan_out_rows``), nothing leased: the ids of the deliveries due
    now, each for a task of its own."""
    return [str(row.pk) for row in fan_out_rows(event_id).due]
