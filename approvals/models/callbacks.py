"""Push callbacks: a runtime key's callback URL, the outbox of decisions to push to it, and
every attempt."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from approvals.models.outbox import OutboxAttempt, OutboxDelivery
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


class CallbackDelivery(OutboxDelivery):
    """One decision to push: an outbox row written in the deciding transaction."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    callback = models.ForeignKey(
        RuntimeCallback, on_delete=models.CASCADE, related_name="deliveries"
    )
    occurrence = models.ForeignKey(
        "Occurrence", on_delete=models.CASCADE, related_name="callback_deliveries"
    )
    event = models.CharField(max_length=32)
    body = models.JSONField()

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


class CallbackAttempt(OutboxAttempt):
    """One POST of a delivery, as it went."""

    delivery = models.ForeignKey(
        CallbackDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )

    class Meta(OutboxAttempt.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["delivery", "number"], name="callback_attempt_number_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"
