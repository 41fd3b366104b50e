"""One tool call and what authorizes it: the occurrence, its proposal versions, reviewers'
votes, the approval (the single-use capability), retired tokens, epochs and the command.

The invariants the database can hold (one approval per proposal version, one command per
approval, unique token hashes, one current proposal per occurrence) are constraints, so
that a bug in a service cannot quietly break them."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from approvals.models.contracts import ToolContract
from approvals.models.tenancy import RuntimeKey, Tenant
from approvals.vocabulary import EFFECT_NOT_SENT


class Occurrence(models.Model):
    """One tool call an agent runtime asked to make."""

    class Status(models.TextChoices):
        PENDING_REVIEW = "pending_review", "Pending review"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        AUTO_ADMITTED = "auto_admitted", "Auto-admitted"
        # The API's value stays "claimed" (v1); every page says what the approval's state
        # says: consumed, one word for one state.
        CLAIMED = "claimed", "Consumed"
        REVOKED = "revoked", "Revoked"
        # The approval expired unclaimed (written by the expiry sweep).
        EXPIRED = "expired", "Expired"
        # Nobody decided before the contract's final deadline (written by the deadlines
        # sweep): fail-closed, nothing can approve it; not a rejection.
        TIMED_OUT = "timed_out", "Timed out"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="occurrences")
    runtime_key = models.ForeignKey(
        RuntimeKey, on_delete=models.PROTECT, related_name="occurrences", null=True, blank=True
    )
    tool = models.ForeignKey(ToolContract, on_delete=models.PROTECT, related_name="occurrences")
    run_id = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    requested_by = models.CharField(max_length=150, blank=True)
    client_ref = models.CharField(max_length=200, blank=True)
    status = models.CharField(
        max_length=32, choices=Status.choices, default=Status.PENDING_REVIEW, db_index=True
    )
    admission_justification = models.CharField(max_length=64, blank=True)
    rejection_reason = models.TextField(blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    # The contract's deadlines as they were at the proposal, on the database's clock
    # (``approvals.reviews.deadlines``); null when the contract sets none.
    review_deadline_at = models.DateTimeField(null=True, blank=True)
    final_deadline_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    # The routing rule's version that chose who is asked (``approvals.routing``), picked
    # inside the proposal's INSERT; null when no rule of the tenant matched.
    routed_by = models.ForeignKey(
        "RoutingRuleVersion",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="occurrences",
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # A client_ref names one tool call of one run: frameworks reuse tool-call ids
            # (call_0) across runs, so two runs may each have their own call_0.
            models.UniqueConstraint(
                fields=["tenant", "run_id", "client_ref"],
                condition=~Q(client_ref=""),
                name="occurrence_run_client_ref_unique",
            ),
        ]
        indexes = [
            # The inbox: its pages in order (id breaks ties) and, with updated_at included,
            # its count and newest change from the index alone (an index-only scan reads
            # no table rows however long the list is).
            models.Index(
                fields=["tenant", "status", "-created_at", "-id"],
                include=["updated_at"],
                name="occurrence_inbox",
            ),
            # The inbox filtered by tool: the same, by tool id, without a join.
            models.Index(
                fields=["tenant", "tool", "status", "-created_at", "-id"],
                include=["updated_at"],
                name="occurrence_inbox_tool",
            ),
            # A run's earlier decisions (prior rejections of a repeated action).
            models.Index(fields=["tenant", "run_id", "status"], name="occurrence_run_status"),
            # The deadlines sweep: pending requests still to escalate, and to time out.
            models.Index(
                fields=["review_deadline_at"],
                condition=Q(status="pending_review", escalated_at__isnull=True)
                & Q(review_deadline_at__isnull=False),
                name="occurrence_review_due",
            ),
            models.Index(
                fields=["final_deadline_at"],
                condition=Q(status="pending_review", final_deadline_at__isnull=False),
                name="occurrence_final_due",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_id} {self.id}"


class Proposal(models.Model):
    """A version of an occurrence's action exactly as digested and shown to reviewers."""

    occurrence = models.ForeignKey(Occurrence, on_delete=models.CASCADE, related_name="proposals")
    version = models.PositiveIntegerField()
    canonical_action = models.TextField(help_text="RFC 8785 canonical JSON of the action.")
    action_digest = models.CharField(max_length=64)
    is_current = models.BooleanField(default=True)
    edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["occurrence", "version"]
        constraints = [
            models.UniqueConstraint(
                fields=["occurrence", "version"], name="proposal_version_unique"
            ),
            models.UniqueConstraint(
                fields=["occurrence"], condition=Q(is_current=True), name="proposal_one_current"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.occurrence_id} v{self.version}"

    @property
    def arguments(self) -> dict[str, Any]:
        """The arguments, read back from the canonical JSON that was digested."""
        return self.arguments_of(self.canonical_action)

    @staticmethod
    def arguments_of(canonical_action: str) -> dict[str, Any]:
        """The arguments of a canonical action read without its proposal."""
        arguments = json.loads(canonical_action).get("arguments", {})
        return arguments if isinstance(arguments, dict) else {}


class ApprovalVote(models.Model):
    """One reviewer's approval of one proposal version; a quorum counts distinct voters."""

    proposal = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="votes")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    seen_digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["proposal", "reviewer"], name="vote_one_per_reviewer"),
        ]

    def __str__(self) -> str:
        return f"vote by {self.reviewer_id} on {self.proposal_id}"


class Approval(models.Model):
    """The capability: a scoped, single-use permission to run one proposal version once.

    The raw token is minted when the runtime picks it up and is never stored: only its
    SHA-256 (for lookup) and a short one-way fingerprint (for logs and operators).
    """

    class State(models.TextChoices):
        ISSUED = "issued", "Issued"
        CONSUMED = "consumed", "Consumed"
        EXPIRED = "expired", "Expired"
        REVOKED = "revoked", "Revoked"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="approvals")
    occurrence = models.ForeignKey(Occurrence, on_delete=models.PROTECT, related_name="approvals")
    proposal = models.OneToOneField(Proposal, on_delete=models.PROTECT, related_name="approval")
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    tool_name = models.CharField(max_length=100)
    action_digest = models.CharField(max_length=64)
    proposal_version = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.ISSUED)
    token_hash = models.CharField(max_length=64, null=True, blank=True, unique=True)
    fingerprint = models.CharField(max_length=16, blank=True, db_index=True)
    issued_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Set when a newer proposal version replaces the approved one: the approval can then
    # authorize nothing (a claim gets scope_mismatch), but it stays on record as it was.
    superseded_at = models.DateTimeField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by_execution = models.CharField(max_length=200, blank=True)
    # The execution a pickup with an ``execution_id`` bound the approval to: only it may
    # ask for the token again (a re-delivery) or claim. Empty: picked up without one (or
    # not yet), the single delivery of API v1 as first shipped.
    bound_execution_id = models.CharField(max_length=200, blank=True, default="", db_default="")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)
    revoke_reason = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("issued_at")),
                name="approval_expiry_after_issue",
            ),
            models.CheckConstraint(
                condition=~Q(state="consumed")
                | (Q(consumed_at__isnull=False) & ~Q(consumed_by_execution="")),
                name="approval_consumed_has_execution",
            ),
            models.CheckConstraint(
                condition=~Q(state="consumed") | Q(token_hash__isnull=False),
                name="approval_consumed_was_delivered",
            ),
            models.CheckConstraint(
                condition=~Q(state="revoked") | Q(revoked_at__isnull=False),
                name="approval_revoked_has_time",
            ),
        ]
        indexes = [
            # The operations queue's "expired, never claimed", oldest first: read from the
            # approvals still open, not from every approval a tenant ever had.
            models.Index(
                fields=["tenant", "expires_at"],
                condition=Q(state__in=["issued", "expired"], superseded_at__isnull=True),
                name="approval_unclaimed_expiry",
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.fingerprint or self.pk} ({self.state})"


class RetiredToken(models.Model):
    """A token a re-delivery replaced: its hash stays known, so a claim with it is named a
    replay of this approval (``token_redelivered``), not an unknown token. Never claimable."""

    approval = models.ForeignKey(Approval, on_delete=models.PROTECT, related_name="retired_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    fingerprint = models.CharField(max_length=16)
    retired_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"retired token {self.fingerprint} of approval {self.approval_id}"


class Epoch(models.Model):
    """One execution attempt of an occurrence. Epochs are appended, never merged."""

    class Justification(models.TextChoices):
        APPROVAL = "approval", "Fresh approval"
        READ_ONLY = "read_only", "Read-only tool"
        IDEMPOTENT_WITH_KEY = "idempotent_with_key", "Idempotent with key"
        NOT_SENT = "not_sent", "Earlier effect known not sent"
        REJECTED = "rejected", "Earlier effect rejected before execution"
        RECONCILED_NOT_COMMITTED = "reconciled_not_committed", "Reconciled as not committed"
        AMBIGUITY_ACCEPTED = "ambiguity_accepted", "Operator accepted the ambiguity"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    occurrence = models.ForeignKey(Occurrence, on_delete=models.PROTECT, related_name="epochs")
    number = models.PositiveIntegerField()
    execution_id = models.CharField(max_length=200)
    justification = models.CharField(max_length=32, choices=Justification.choices)
    previous = models.OneToOneField(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="next"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["occurrence", "number"]
        constraints = [
            models.UniqueConstraint(fields=["occurrence", "number"], name="epoch_number_unique"),
        ]

    def __str__(self) -> str:
        return f"epoch {self.number} of {self.occurrence_id}"


class Command(models.Model):
    """What the runtime executes; created in the same transaction that claims the approval."""

    class State(models.TextChoices):
        """The effect evidence of the command: what the outside world did with it.

        ``pending`` is the outbox (nothing has been sent; the effect vocabulary calls it
        ``not_sent``, which the API shows as ``effect_state``). Only ``reconciliation``
        moves a command on from here, each step a guarded update with its audit event."""

        PENDING = "pending", "Not sent"
        SENDING = "sending", "Sending"
        COMMITTED = "committed", "Committed"
        REJECTED = "rejected", "Rejected"
        OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"
        RECONCILED = "reconciled", "Reconciled"
        COMPENSATED = "compensated", "Compensated"

    class ExecutedBy(models.TextChoices):
        CONSOLE = "console", "The console (adapter)"
        RUNTIME = "runtime", "The agent runtime"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="commands")
    occurrence = models.ForeignKey(Occurrence, on_delete=models.PROTECT, related_name="commands")
    approval = models.OneToOneField(
        Approval, on_delete=models.PROTECT, null=True, blank=True, related_name="command"
    )
    epoch = models.OneToOneField(Epoch, on_delete=models.PROTECT, related_name="command")
    execution_id = models.CharField(max_length=200)
    idempotency_key = models.CharField(max_length=80, unique=True)
    action_digest = models.CharField(max_length=64)
    state = models.CharField(max_length=32, choices=State.choices, default=State.PENDING)
    executed_by = models.CharField(
        max_length=16, choices=ExecutedBy.choices, default=ExecutedBy.CONSOLE
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            # The outbox sweep: console-executed commands still pending (or stuck sending).
            models.Index(fields=["state", "updated_at"], name="command_state_updated"),
        ]

    def __str__(self) -> str:
        return f"command {self.id}"

    @property
    def effect_state(self) -> str:
        """The state in the effect vocabulary of DESIGN.md (``not_sent`` for the outbox)."""
        return EFFECT_NOT_SENT if self.state == self.State.PENDING else self.state
