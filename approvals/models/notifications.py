"""How reviewers are told: the notification outbox (an event written in the transaction
that created or changed a request), its deliveries per channel and recipient with every
attempt, and each reviewer's preferences (``approvals.notifications``)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from approvals.models.outbox import OutboxAttempt, OutboxDelivery
from approvals.models.routing import ReviewerGroup
from approvals.models.tenancy import Tenant


class Channel(models.TextChoices):
    EMAIL = "email", "E-mail"
    SLACK = "slack", "Slack"
    # A Slack app (Web API chat.postMessage): the decision is a reply in the request's thread.
    SLACK_APP = "slack_app", "Slack app"
    WEBHOOK = "webhook", "Webhook"
    # In the console itself: the header's unread count.
    CONSOLE = "console", "In the console"


class NotificationEvent(models.Model):
    """The outbox: something reviewers must hear of, written in the transaction that did
    it; a task fans it out into deliveries after commit (``fanned_out_at`` says it did)."""

    class Kind(models.TextChoices):
        REQUESTED = "requested", "Requested"
        ESCALATED = "escalated", "Escalated"
        DECIDED = "decided", "Decided"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    occurrence = models.ForeignKey(
        "Occurrence", on_delete=models.CASCADE, related_name="notification_events"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # For a decision: what it was (approved, rejected, timed_out ...).
    outcome = models.CharField(max_length=32, blank=True)
    # For a reviewer's decision: who made it (the console user's name), so that the
    # group's channels say who approved or rejected; blank for a timeout.
    decided_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    fanned_out_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=Q(fanned_out_at__isnull=True),
                name="notification_event_due",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} of {self.occurrence_id}"


class NotificationDelivery(OutboxDelivery):
    """One message on one channel: to a reviewer (e-mail, the console) or to a group
    (Slack, webhook). ``body`` holds what the channel sends, sensitive arguments already
    left out. A reviewer's e-mail in digest mode waits (``held``) until the digest that
    carries it is sent (``digest``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    event = models.ForeignKey(
        NotificationEvent,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="deliveries",
    )
    channel = models.CharField(max_length=16, choices=Channel.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="notifications",
    )
    group = models.ForeignKey(
        ReviewerGroup, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    body = models.JSONField()
    held = models.BooleanField(default=False)
    digest = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="carried"
    )
    read_at = models.DateTimeField(null=True, blank=True)
    # A Slack app's message as Slack recorded it (chat.postMessage's ``ts`` and ``channel``):
    # the request's message is the thread its decision replies in.
    slack_ts = models.CharField(max_length=32, blank=True)
    slack_channel = models.CharField(max_length=32, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(state="pending", held=False),
                name="notification_delivery_due",
            ),
            models.Index(
                fields=["user"],
                condition=Q(channel="console", read_at__isnull=True),
                name="notification_unread",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel} {self.pk} ({self.state})"


class NotificationAttempt(OutboxAttempt):
    """One send of a notification, as it went."""

    delivery = models.ForeignKey(
        NotificationDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )

    class Meta(OutboxAttempt.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["delivery", "number"], name="notification_attempt_number_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"


class NotificationPreference(models.Model):
    """How one reviewer wants one channel: every request, a digest every N minutes, or
    nothing; quiet hours (in their time zone) defer what would be sent during them."""

    class Mode(models.TextChoices):
        EVERY = "every", "Every request"
        DIGEST = "digest", "A digest"
        NONE = "none", "Nothing"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_prefs"
    )
    channel = models.CharField(max_length=16, choices=Channel.choices)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.EVERY)
    digest_minutes = models.PositiveIntegerField(default=60)
    time_zone = models.CharField(max_length=64, default="UTC")
    quiet_start = models.TimeField(null=True, blank=True)
    quiet_end = models.TimeField(null=True, blank=True)
    last_digest_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "channel"], name="notification_pref_unique"),
            models.CheckConstraint(
                condition=Q(digest_minutes__gte=1), name="notification_digest_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} {self.channel}: {self.mode}"
