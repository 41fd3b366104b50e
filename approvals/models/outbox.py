"""What every outbox row shares: a message to send after its transaction committed, tried
until it is delivered or its attempts run out, each attempt recorded
(``approvals.outbound.outbox`` does the trying). Callbacks and notifications are both."""

from __future__ import annotations

from django.db import models


class OutboxDelivery(models.Model):
    """One message to send: pending until delivered, or failed after the last attempt."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    # Held by the task making an attempt; a worker that died mid-call lets it run out.
    leased_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class OutboxAttempt(models.Model):
    """One attempt at a delivery, as it went (a concrete subclass adds ``delivery``)."""

    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        abstract = True
        ordering = ["number"]
