"""Push callbacks: a runtime key's callback URL, the outbox of decisions to push to it, and
every attempt."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from approvals.models.tenancy import RuntimeKey


class RuntimeCallback(models.Model):
    """Where a runtime key wants its requests' decisions pushed (``approvals.callbacks``).
    The signing secret is stored encrypted: the console signs with it."""

    runtime_key = models.OneToOneField(
        RuntimeKey, on_delete=models.CASCADE, related_name="callback"
    )
    url = models.URLField(max_length=2000)
    secret_encrypted = models.TextField()
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"callback of {self.runtime_key_id}: {self.url}"


class CallbackDelivery(models.Model):
    """One decision to push: an outbox row written in the deciding transaction."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    callback = models.ForeignKey(
        RuntimeCallback, on_delete=models.CASCADE, related_name="deliveries"
    )
    occurrence = models.ForeignKey(
        "Occurrence", on_delete=models.CASCADE, related_name="callback_deliveries"
    )
    event = models.CharField(max_length=32)
    body = models.JSONField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    # Held by the task making an attempt; a worker that died mid-call lets it run out.
    leased_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(state="pending"),
                name="callback_delivery_due",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} of {self.occurrence_id} ({self.state})"


class CallbackAttempt(models.Model):
    """One POST of a delivery, as it went."""

    delivery = models.ForeignKey(
        CallbackDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["number"]
        constraints = [
            models.UniqueConstraint(
                fields=["delivery", "number"], name="callback_attempt_number_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"
