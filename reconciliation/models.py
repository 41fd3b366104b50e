"""Effect and recovery evidence, and the admission of epochs after the first.

The command's effect state lives on ``approvals.Command.state`` (one column, moved only by
this app's services with guarded updates). Here are the records that explain it: each call
to the outside world (``AdapterInvocation``), each stop that needs something before the
occurrence can go on (``Interruption``), and each decision that admitted a new epoch
(``EpochAdmission``), kept apart and never inferred from each other.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from approvals.models import Command, Epoch, Occurrence, Tenant


class AdapterInvocation(models.Model):
    """One call to the outside world, committed before the call is made."""

    class Kind(models.TextChoices):
        EXECUTE = "execute", "Execute"
        QUERY = "query", "Query the effect"
        COMPENSATE = "compensate", "Compensate"

    class Outcome(models.TextChoices):
        COMMITTED = "committed", "Committed"
        REJECTED = "rejected", "Rejected before execution"
        OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"
        INTERRUPTED = "interrupted", "Interrupted (authentication)"
        NOT_FOUND = "not_found", "Effect not found"
        # A later delivery found the row unfinished: the worker died, or the call outlived
        # the broker's visibility timeout. Its real outcome is what the evidence says.
        ABANDONED = "abandoned", "Abandoned (found unfinished)"

    command = models.ForeignKey(Command, on_delete=models.PROTECT, related_name="invocations")
    epoch = models.ForeignKey(Epoch, on_delete=models.PROTECT, related_name="invocations")
    number = models.PositiveIntegerField(help_text="1, 2, … per command, every kind counted.")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.EXECUTE)
    # Why this call was allowed: the first delivery of an epoch, or the contract's
    # justification for calling again (see ``reconciliation.dispatch``).
    justification = models.CharField(max_length=64)
    message_id = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=32, choices=Outcome.choices, blank=True)
    receipt = models.CharField(max_length=200, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["command", "number"]
        constraints = [
            models.UniqueConstraint(fields=["command", "number"], name="invocation_number_unique"),
        ]

    def __str__(self) -> str:
        return f"invocation {self.number} of {self.command_id}"


class Interruption(models.Model):
    """Recovery evidence: why an epoch stopped and what it needs to go on."""

    class Kind(models.TextChoices):
        AUTH_CHALLENGE = "auth_challenge", "Authentication challenge"
        CONFIRMATION_REQUIRED = "confirmation_required", "Confirmation required"

    command = models.ForeignKey(Command, on_delete=models.PROTECT, related_name="interruptions")
    epoch = models.ForeignKey(Epoch, on_delete=models.PROTECT, related_name="interruptions")
    invocation = models.ForeignKey(
        AdapterInvocation, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    kind = models.CharField(max_length=32, choices=Kind.choices)
    # Every WWW-Authenticate value exactly as received, in order: what a re-authentication
    # needs (realm, scope, error) is in them, and a summary would lose it.
    challenges = models.JSONField(default=list)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["resolved_at", "kind"], name="interruption_open")]

    def __str__(self) -> str:
        return f"{self.kind} on {self.command_id}"


class EpochAdmission(models.Model):
    """The decision that admitted an epoch after the first, with its justification and
    what it links: the occurrence's previous epoch and the interruption that stopped it."""

    epoch = models.OneToOneField(Epoch, on_delete=models.PROTECT, related_name="admission")
    previous = models.ForeignKey(Epoch, on_delete=models.PROTECT, related_name="+")
    command = models.ForeignKey(Command, on_delete=models.PROTECT, related_name="admissions")
    interruption = models.ForeignKey(
        Interruption, on_delete=models.PROTECT, null=True, blank=True, related_name="admissions"
    )
    # The operator's decision that admitted it (accept-ambiguity, retry), if one did.
    decision = models.ForeignKey(
        "OperatorDecision", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    justification = models.CharField(max_length=32, choices=Epoch.Justification.choices)
    # What the justification rests on, in words: the effect found, the contract, the event.
    basis = models.TextField()
    decided_by = models.CharField(max_length=150)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"admission of {self.epoch_id} ({self.justification})"


class AdapterCredential(models.Model):
    """A secret the console uses to call an adapter for a tenant (the payments API key).

    Stored encrypted with a key derived from ``SECRET_KEY``; never shown after saving.
    Replacing it is what restores authority after an authentication challenge.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.CharField(max_length=100)
    secret_encrypted = models.TextField()
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "adapter"], name="credential_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.adapter} credential of {self.tenant_id}"


class WebhookTarget(models.Model):
    """Where a tenant's ``send_message`` commands are POSTed, and the HMAC secret that
    signs them. Without one, ``MESSAGES_WEBHOOK_URL`` and ``MESSAGES_WEBHOOK_SECRET``."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="+")
    url = models.URLField(max_length=500)
    secret_encrypted = models.TextField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"webhook of {self.tenant_id}"


class OperatorDecision(models.Model):
    """An operator's explicit, named and recorded decision about a command's effect."""

    class Action(models.TextChoices):
        QUERY_EFFECT = "query_effect", "Queried the effect"
        RECONCILE = "reconcile", "Reconciled by hand"
        ACCEPT_AMBIGUITY = "accept_ambiguity", "Accepted the ambiguity"
        RETRY = "retry", "Retried"
        COMPENSATE = "compensate", "Compensated"

    class Finding(models.TextChoices):
        """What the decision establishes about the effect, if anything."""

        COMMITTED = "committed", "Committed"
        NOT_COMMITTED = "not_committed", "Not committed"
        COMPENSATED = "compensated", "Compensated"
        NONE = "", "Nothing established"

    command = models.ForeignKey(Command, on_delete=models.PROTECT, related_name="decisions")
    action = models.CharField(max_length=32, choices=Action.choices)
    finding = models.CharField(max_length=16, choices=Finding.choices, blank=True)
    # A receipt id or a link: what the finding rests on.
    evidence = models.CharField(max_length=500, blank=True)
    note = models.TextField()
    operator = models.CharField(max_length=150)
    # The effect state the decision found and the one it left.
    state_before = models.CharField(max_length=32)
    state_after = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.CheckConstraint(condition=~models.Q(note=""), name="decision_note_required"),
        ]

    def __str__(self) -> str:
        return f"{self.action} on {self.command_id} by {self.operator}"


class EscalationPolicy(models.Model):
    """Where and when a tenant hears about queue items nobody took: escalation only tells,
    it never acts."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="+")
    after_minutes = models.PositiveIntegerField(default=30)
    webhook_url = models.URLField(max_length=500, blank=True)
    secret_encrypted = models.TextField(blank=True)
    email = models.EmailField(blank=True)

    def __str__(self) -> str:
        return f"escalation of {self.tenant_id}"


class Escalation(models.Model):
    """One queue item escalated once (the unique key makes "once" hold between workers)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    item_key = models.CharField(max_length=200)
    reason = models.CharField(max_length=32)
    occurrence_id = models.UUIDField()
    created_at = models.DateTimeField(auto_now_add=True)
    delivered = models.BooleanField(default=False)
    attempts = models.PositiveSmallIntegerField(default=0)
    detail = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "item_key"], name="escalation_once"),
        ]

    def __str__(self) -> str:
        return f"escalation {self.item_key}"


class QueueTake(models.Model):
    """Who is on an occurrence of the operators' queue ("I'm on it"): one row per
    occurrence, its holder set and cleared by guarded updates (``reconciliation.takes``).
    A take lapses at ``expires_at`` (the database's clock) without anyone clearing it: the
    readers compare, so an expired row reads as nobody's."""

    occurrence = models.OneToOneField(Occurrence, on_delete=models.CASCADE, related_name="take")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    holder = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
    )
    # The name the queue shows ("Rita is on it"), kept as it was when taken.
    holder_name = models.CharField(max_length=150, blank=True)
    taken_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(
                    holder__isnull=True, taken_at__isnull=True, expires_at__isnull=True
                )
                | models.Q(holder__isnull=False, taken_at__isnull=False, expires_at__isnull=False),
                name="take_holder_has_times",
            ),
        ]
        indexes = [models.Index(fields=["holder", "expires_at"], name="take_by_holder")]

    def __str__(self) -> str:
        return f"take of {self.occurrence_id} by {self.holder_name or 'nobody'}"
