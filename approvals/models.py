"""Execution authority: who may act, on exactly which action, and how often.

The models keep the invariants the database can hold (one approval per proposal version,
one command per approval, unique token hashes, one current proposal per occurrence) as
constraints, so that a bug in a service cannot quietly break them.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    class Role(models.TextChoices):
        REVIEWER = "reviewer", "Reviewer"
        OPERATOR = "operator", "Operator"
        ADMIN = "admin", "Admin"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant", "role"], name="membership_unique"),
            models.CheckConstraint(
                condition=Q(role__in=["reviewer", "operator", "admin"]),
                name="membership_role_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class RuntimeKey(models.Model):
    """A bearer key an agent runtime uses for the API. Only its SHA-256 is stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="runtime_keys")
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True)
    # The first characters of the key, enough to tell keys apart in the admin.
    prefix = models.CharField(max_length=16)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="runtime_key_name_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name} ({self.prefix}…)"


class ToolContract(models.Model):
    class ReplaySafety(models.TextChoices):
        READ_ONLY = "read_only", "Read-only"
        IDEMPOTENT_WITH_KEY = "idempotent_with_key", "Idempotent with key"
        EFFECT_QUERYABLE = "effect_queryable", "Effect queryable"
        UNSAFE = "unsafe", "Unsafe"

    class Risk(models.TextChoices):
        LOW = "low", "Low"
        MEDIUM = "medium", "Medium"
        HIGH = "high", "High"

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    json_schema = models.JSONField(help_text="JSON Schema (2020-12) of the tool's arguments.")
    replay_safety = models.CharField(
        max_length=32, choices=ReplaySafety.choices, default=ReplaySafety.UNSAFE
    )
    risk = models.CharField(max_length=16, choices=Risk.choices, default=Risk.MEDIUM)
    adapter = models.CharField(max_length=100, blank=True)
    auto_admit = models.BooleanField(
        default=False,
        help_text="Admit calls by policy, without review. Only for read-only tools.",
    )
    approval_lifetime = models.DurationField(default=timedelta(minutes=15))
    approvals_required = models.PositiveSmallIntegerField(
        default=1,
        help_text="Distinct approvers needed (above the quorum threshold, if one is set).",
    )
    quorum_amount_argument = models.CharField(
        max_length=100,
        blank=True,
        help_text="Integer argument compared with the threshold, e.g. amount_minor.",
    )
    quorum_threshold_minor = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="The quorum applies only when the amount argument is above this value.",
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(auto_admit=False) | Q(replay_safety="read_only"),
                name="contract_auto_admit_read_only",
            ),
            models.CheckConstraint(
                condition=Q(approvals_required__gte=1), name="contract_approvals_required_positive"
            ),
            models.CheckConstraint(
                condition=Q(approval_lifetime__gt=timedelta(0)),
                name="contract_approval_lifetime_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from approvals.canonical import check_contract_schema

        errors = check_contract_schema(self.json_schema)
        if errors:
            raise ValidationError({"json_schema": errors})
        if self.auto_admit and self.replay_safety != self.ReplaySafety.READ_ONLY:
            raise ValidationError({"auto_admit": "Only read-only tools may be auto-admitted."})
        amount = self.json_schema.get("properties", {}).get(self.quorum_amount_argument, {})
        if self.quorum_amount_argument and amount.get("type") != "integer":
            raise ValidationError(
                {"quorum_amount_argument": "Name an integer argument of the schema."}
            )
        if bool(self.quorum_amount_argument) != (self.quorum_threshold_minor is not None):
            raise ValidationError(
                {"quorum_threshold_minor": "Set the amount argument and the threshold together."}
            )

    def approvals_needed(self, arguments: dict[str, Any]) -> int:
        """How many distinct approvers this call needs."""
        if not self.quorum_amount_argument or self.quorum_threshold_minor is None:
            return self.approvals_required
        amount = arguments.get(self.quorum_amount_argument)
        if isinstance(amount, int) and amount > self.quorum_threshold_minor:
            return self.approvals_required
        return 1


class Occurrence(models.Model):
    """One tool call an agent runtime asked to make."""

    class Status(models.TextChoices):
        PENDING_REVIEW = "pending_review", "Pending review"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        AUTO_ADMITTED = "auto_admitted", "Auto-admitted"
        CLAIMED = "claimed", "Claimed"
        REVOKED = "revoked", "Revoked"

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
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "client_ref"],
                condition=~Q(client_ref=""),
                name="occurrence_client_ref_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "status", "-created_at"]),
            # The inbox filtered by tool: its count and its pages, without a join.
            models.Index(fields=["tenant", "tool", "status", "-created_at"]),
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
        arguments = json.loads(self.canonical_action).get("arguments", {})
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

    def __str__(self) -> str:
        return f"approval {self.fingerprint or self.pk} ({self.state})"


class Epoch(models.Model):
    """One execution attempt of an occurrence. Epochs are appended, never merged."""

    class Justification(models.TextChoices):
        APPROVAL = "approval", "Fresh approval"
        READ_ONLY = "read_only", "Read-only tool"
        IDEMPOTENT_WITH_KEY = "idempotent_with_key", "Idempotent with key"
        NOT_SENT = "not_sent", "Earlier effect known not sent"
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
        PENDING = "pending", "Pending dispatch"
        DISPATCHED = "dispatched", "Dispatched"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"

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
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"command {self.id}"


class AuditEvent(models.Model):
    """Append-only evidence. ``event_id`` is the producer's; ``id`` is the ingestion's.

    A duplicated delivery of the same producer event shows up as two rows with one
    ``event_id``, which is why that column is deliberately not unique.
    """

    event_id = models.UUIDField(default=uuid.uuid4, db_index=True)
    kind = models.CharField(max_length=64)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="audit_events")
    occurrence = models.ForeignKey(
        Occurrence, on_delete=models.PROTECT, null=True, blank=True, related_name="audit_events"
    )
    actor = models.CharField(max_length=150, blank=True)
    token_fingerprint = models.CharField(max_length=16, blank=True)
    decision = models.CharField(max_length=32, blank=True)
    reason_code = models.CharField(max_length=64, blank=True)
    execution_id = models.CharField(max_length=200, blank=True)
    message_id = models.CharField(max_length=200, blank=True)
    command_id = models.UUIDField(null=True, blank=True)
    trace_id = models.CharField(max_length=64, blank=True)
    source_time = models.DateTimeField()
    ingested_at = models.DateTimeField(auto_now_add=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["tenant", "id"]),
            models.Index(fields=["occurrence", "id"]),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_id}"
