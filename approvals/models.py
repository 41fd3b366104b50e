"""Execution authority: who may act, on exactly which action, and how often.

The models keep the invariants the database can hold (one approval per proposal version,
one command per approval, unique token hashes, one current proposal per occurrence) as
constraints, so that a bug in a service cannot quietly break them.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring
from typing import Any

import rfc8785
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from approvals import vocabulary


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # Requests one runtime key may make per rate-limit window (``approvals.ratelimit``).
    api_rate_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="API requests per runtime key per window (API_RATE_WINDOW_SECONDS). "
        "Empty: the API_RATE_LIMIT setting.",
    )

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
    # When the key last authenticated an API call, to the minute: written only when the
    # stored value is a minute old (``services.runtime_key_authenticate``).
    last_used_at = models.DateTimeField(null=True, blank=True)
    # An admin's grant: keys of the tenant with the same non-empty group are one runtime and
    # may pick up and claim each other's requests. Otherwise only the key that proposed may.
    runtime_group = models.CharField(
        max_length=100,
        blank=True,
        help_text="Keys of this tenant with the same group may pick up and claim each "
        "other's requests. Empty: only this key's own.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="runtime_key_name_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name} ({self.prefix}…)"

    @property
    def actor(self) -> str:
        """How audit events name this key."""
        return f"runtime:{self.name}"


class ReviewerToken(models.Model):
    """A reviewer's personal access token: approve or reject through the API (tools,
    scripts, tests) under the same rules as the review page. Scoped to one tenant and to
    deciding; only its SHA-256 is stored; revocable; expires."""

    class Scope(models.TextChoices):
        DECIDE = "decide", "Approve and reject requests"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reviewer_tokens"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="reviewer_tokens")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.DECIDE)
    token_hash = models.CharField(max_length=64, unique=True)
    # The first characters of the token, enough to tell tokens apart on the page.
    prefix = models.CharField(max_length=16)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant", "name"], name="reviewer_token_name_unique"
            ),
            models.CheckConstraint(
                condition=Q(scope__in=["decide"]), name="reviewer_token_scope_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user}@{self.tenant}/{self.name} ({self.prefix}…)"


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


class RuntimeKeyUsage(models.Model):
    """What one runtime key did in one rate-limit window: its requests, and its refused
    claims with a token the tenant never issued. A counter row, updated by one atomic
    upsert per request (``approvals.ratelimit``) and deleted when the window is reported."""

    runtime_key = models.ForeignKey(RuntimeKey, on_delete=models.CASCADE, related_name="usage")
    # The window's start in Unix seconds, a multiple of ``window_seconds``.
    window_start = models.BigIntegerField()
    window_seconds = models.PositiveIntegerField()
    # The limit the requests were held to (the tenant's, or the setting's).
    request_limit = models.PositiveIntegerField()
    requests = models.PositiveIntegerField(default=0)
    unknown_token_refusals = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["runtime_key", "window_start"], name="runtime_key_usage_window_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.runtime_key_id}@{self.window_start}: {self.requests}"


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
    # Retries the contract's replay safety allows (a refusal before execution, a retry with
    # the same idempotency key) are bounded: each is a new adapter invocation.
    max_attempts = models.PositiveSmallIntegerField(
        default=3, help_text="Adapter calls per epoch, the first included."
    )
    retry_backoff = models.DurationField(
        default=timedelta(seconds=2),
        help_text="Wait before the second call; doubled before each later one.",
    )
    approvals_required = models.PositiveSmallIntegerField(
        default=1,
        help_text="Distinct approvers needed (above the quorum threshold, if one is set).",
    )
    # The quorum rule. Without an amount argument every call needs approvals_required.
    # Money (an amount beside an ISO 4217 currency) is compared with the threshold of its
    # own currency, in that currency's minor units; a currency without a threshold needs
    # the quorum. quorum_threshold_minor is the older, currency-blind rule: it is kept for
    # amounts that carry no currency (no quorum_currency_argument), and refused beside one.
    quorum_amount_argument = models.CharField(
        max_length=100,
        blank=True,
        help_text="Integer argument compared with the threshold, e.g. amount_minor.",
    )
    quorum_currency_argument = models.CharField(
        max_length=100,
        blank=True,
        help_text="String argument holding the amount's ISO 4217 currency, e.g. currency. "
        "With it, thresholds are per currency (below).",
    )
    quorum_thresholds_minor = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per currency, in its minor units: {"EUR": 50000, "JPY": 75000} (JPY has '
        "no minor unit: 75000 is 75,000 yen). The quorum applies above a currency's "
        "threshold, and always for a currency that has none here.",
    )
    quorum_threshold_minor = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Only for an amount without a currency argument: the quorum applies when "
        "the amount argument is above this value.",
    )
    reject_repeats = models.BooleanField(
        default=False,
        help_text="Reject, without a review, a proposal repeating an action a reviewer "
        "already rejected in the same run (same digest); the original reason is kept.",
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
        properties = self.json_schema.get("properties", {})
        amount = properties.get(self.quorum_amount_argument, {})
        if self.quorum_amount_argument and amount.get("type") != "integer":
            raise ValidationError(
                {"quorum_amount_argument": "Name an integer argument of the schema."}
            )
        if self.quorum_thresholds_minor is None:
            self.quorum_thresholds_minor = {}
        if self.quorum_currency_argument:
            self._clean_currency_quorum(properties)
        elif self.quorum_thresholds_minor:
            raise ValidationError(
                {"quorum_currency_argument": "Per-currency thresholds need the currency argument."}
            )
        elif bool(self.quorum_amount_argument) != (self.quorum_threshold_minor is not None):
            raise ValidationError(
                {"quorum_threshold_minor": "Set the amount argument and the threshold together."}
            )

    def _clean_currency_quorum(self, properties: dict[str, Any]) -> None:
        from approvals.canonical import currency_exponent

        currency = properties.get(self.quorum_currency_argument, {})
        if currency.get("type") != "string":
            raise ValidationError(
                {"quorum_currency_argument": "Name a string argument of the schema."}
            )
        if not self.quorum_amount_argument:
            raise ValidationError(
                {"quorum_amount_argument": "Name the amount the per-currency thresholds apply to."}
            )
        if self.quorum_threshold_minor is not None:
            raise ValidationError(
                {
                    "quorum_threshold_minor": "With a currency argument the thresholds are per "
                    "currency; leave the single threshold empty."
                }
            )
        thresholds = self.quorum_thresholds_minor
        if not isinstance(thresholds, dict):
            raise ValidationError(
                {"quorum_thresholds_minor": 'A JSON object such as {"EUR": 50000}.'}
            )
        problems = [
            f"{code}: not an ISO 4217 currency"
            for code in thresholds
            if currency_exponent(code) is None
        ] + [
            f"{code}: the threshold must be a whole number of minor units, 0 or more"
            for code, value in thresholds.items()
            if not isinstance(value, int) or isinstance(value, bool) or value < 0
        ]
        if problems:
            raise ValidationError({"quorum_thresholds_minor": problems})

    def quorum_threshold(self, arguments: dict[str, Any]) -> int | None:
        """The threshold this call's amount is compared with: its currency's, or the
        currency-blind one; None when there is none, and the quorum applies."""
        if not self.quorum_currency_argument:
            return self.quorum_threshold_minor
        currency = arguments.get(self.quorum_currency_argument)
        thresholds = self.quorum_thresholds_minor
        if not isinstance(currency, str) or not isinstance(thresholds, dict):
            return None
        value = thresholds.get(currency)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def approvals_needed(self, arguments: dict[str, Any]) -> int:
        """How many distinct approvers this call needs: ``approvals_required``, or 1 when
        the amount is at or below its threshold (see ``quorum_threshold``)."""
        if not self.quorum_amount_argument:
            return self.approvals_required
        threshold = self.quorum_threshold(arguments)
        amount = arguments.get(self.quorum_amount_argument)
        if (
            threshold is None
            or not isinstance(amount, int)
            or isinstance(amount, bool)
            or amount > threshold
        ):
            return self.approvals_required
        return 1

    @property
    def executed_by(self) -> str:
        """Who executes a claimed call: the console when the contract names an adapter,
        otherwise the runtime (a ``Command.ExecutedBy`` value)."""
        return "console" if self.adapter else "runtime"


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


EFFECT_NOT_SENT = "not_sent"


# The prev_hash of the first event of every tenant's chain.
AUDIT_CHAIN_GENESIS = "0" * 64


class AuditIngestion(models.Model):
    """One batch of producer events POSTed to ``/api/v1/audit/events``, as it was received.

    Every line of the batch is either a new ``AuditEvent`` (whose ``ingestion`` is this row)
    or an ``AuditDuplicateDelivery`` of an event stored before. Append-only like the events:
    on PostgreSQL a trigger refuses UPDATE and DELETE.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="audit_ingestions")
    runtime_key = models.ForeignKey(
        RuntimeKey,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="audit_ingestions",
    )
    received = models.PositiveIntegerField(help_text="Lines in the batch.")
    new = models.PositiveIntegerField(help_text="Lines stored as new events.")
    duplicates = models.PositiveIntegerField(help_text="Lines whose producer event was stored.")
    trace_id = models.CharField(max_length=64, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(received=models.F("new") + models.F("duplicates")),
                name="audit_ingestion_counts_add_up",
            ),
        ]

    def __str__(self) -> str:
        return f"ingestion {self.pk}: {self.new} new, {self.duplicates} duplicates"


# The events an investigation's verdict rests on: approved claims and committed effects.
# Queries name them with this very condition, which the audit_decisive_* indexes share.
DECISIVE_EVENTS = Q(decision=vocabulary.ClaimDecision.APPROVED) | Q(
    kind=vocabulary.AuditKind.EFFECT_COMMITTED
)


class AuditEvent(models.Model):
    """Append-only evidence. ``event_id`` is the producer's; ``id`` is the ingestion's.

    The console stores one producer event once per tenant: a producer event delivered again
    through ``POST /api/v1/audit/events`` becomes an ``AuditDuplicateDelivery`` pointing at
    this row, not a second event. ``event_id`` carries no unique index of its own (rows the
    console wrote before ingestion existed may repeat one); events that came through
    ingestion are unique per tenant by constraint.

    **Tamper evidence.** Each tenant's events form a hash chain: ``chain_seq`` (1, 2, ...
    per tenant), ``hash`` (SHA-256 of ``chain_form``, RFC 8785) and ``prev_hash`` (the hash
    of the event before it in the chain). They are NULL when the event is written, off
    the claim's hot path, and set once by ``services.audit_chain_extend``; the
    append-only trigger allows exactly that one UPDATE and nothing else.
    """

    event_id = models.UUIDField(default=uuid.uuid4, db_index=True)
    kind = models.CharField(max_length=64)
    # Indexed by (tenant, id) and (occurrence, id) below: a single-column index of each
    # would only be more work for every insert (the claim's) and for chaining.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="audit_events", db_index=False
    )
    occurrence = models.ForeignKey(
        Occurrence,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="audit_events",
        db_index=False,
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
    # The batch that delivered the event when another producer sent it; NULL for the
    # console's own events, which is why its index (below) leaves NULL out: the claim's
    # insert maintains no index for it.
    ingestion = models.ForeignKey(
        AuditIngestion,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="events",
        db_index=False,
    )
    # NULL (not "") until chained: the trigger lets only NULL chain columns be set.
    chain_seq = models.PositiveBigIntegerField(null=True, blank=True, editable=False)
    hash = models.CharField(max_length=64, null=True, blank=True, editable=False)  # noqa: DJ001
    prev_hash = models.CharField(  # noqa: DJ001
        max_length=64, null=True, blank=True, editable=False
    )

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["tenant", "id"]),
            models.Index(fields=["occurrence", "id"]),
            # What the chain extension still has to do: small, since it is done every
            # few seconds.
            models.Index(
                fields=["tenant", "id"], condition=Q(chain_seq__isnull=True), name="audit_unchained"
            ),
            models.Index(
                fields=["ingestion"], condition=Q(ingestion__isnull=False), name="audit_ingested"
            ),
            # The export's and investigators' filters by token and by execution.
            models.Index(
                fields=["tenant", "token_fingerprint", "id"],
                condition=~Q(token_fingerprint=""),
                name="audit_tenant_fingerprint",
            ),
            models.Index(
                fields=["tenant", "execution_id", "id"],
                condition=~Q(execution_id=""),
                name="audit_tenant_execution",
            ),
            # A review page's effect line: a command's newest effect events, found without
            # walking an occurrence's whole history (thousands of refused replays, say).
            models.Index(
                fields=["command_id", "id"],
                condition=Q(kind__in=vocabulary.EFFECT_KINDS),
                name="audit_command_effects",
            ),
            # An investigation's decisive events (what its verdict rests on), one index per
            # way its chain names an event, so that a chain of thousands of refused
            # replays is not read to find its one approved claim. Few rows: one or two per
            # approval.
            models.Index(
                fields=["tenant", "token_fingerprint"],
                condition=DECISIVE_EVENTS,
                name="audit_decisive_fingerprint",
            ),
            models.Index(
                fields=["tenant", "execution_id"],
                condition=DECISIVE_EVENTS,
                name="audit_decisive_execution",
            ),
            models.Index(
                fields=["occurrence"], condition=DECISIVE_EVENTS, name="audit_decisive_occurrence"
            ),
            models.Index(
                fields=["command_id"], condition=DECISIVE_EVENTS, name="audit_decisive_command"
            ),
            # Other producers' events that name a command, newest first (an investigation
            # by command id): the console's own events carry their occurrence, so only
            # ingested ones are indexed, and the claim's insert maintains nothing for it.
            models.Index(
                fields=["command_id", "id"],
                condition=Q(ingestion__isnull=False),
                name="audit_ingested_command",
            ),
        ]
        constraints = [
            # A fork of the chain (two events with one chain_seq) cannot be stored.
            models.UniqueConstraint(
                fields=["tenant", "chain_seq"],
                condition=Q(chain_seq__isnull=False),
                name="audit_chain_seq_unique",
            ),
            models.CheckConstraint(
                condition=(
                    Q(chain_seq__isnull=True) & Q(hash__isnull=True) & Q(prev_hash__isnull=True)
                )
                | (Q(chain_seq__isnull=False) & Q(hash__isnull=False) & Q(prev_hash__isnull=False)),
                name="audit_chain_columns_together",
            ),
            models.UniqueConstraint(
                fields=["tenant", "event_id"],
                condition=Q(ingestion__isnull=False),
                name="audit_ingested_event_once",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_id}"

    def chain_form(self, *, chain_seq: int, prev_hash: str) -> dict[str, Any]:
        """What the chain hashes: every field of the event, its place in the chain and the
        hash of the event before it, as JSON values that read the same on every database.

        Left out: ``hash`` itself. Including ``chain_seq`` and ``prev_hash`` is what makes
        it a chain: rewriting one event means rewriting every later one."""
        return {
            "actor": self.actor,
            "chain_seq": chain_seq,
            "command_id": str(self.command_id) if self.command_id else None,
            "data": self.data,
            "decision": self.decision,
            "event_id": str(self.event_id),
            "execution_id": self.execution_id,
            "id": self.pk,
            "ingested_at": _utc_text(self.ingested_at),
            "ingestion_id": self.ingestion_id,
            "kind": self.kind,
            "message_id": self.message_id,
            "occurrence_id": str(self.occurrence_id) if self.occurrence_id else None,
            "prev_hash": prev_hash,
            "reason_code": self.reason_code,
            "source_time": _utc_text(self.source_time),
            "tenant_id": self.tenant_id,
            "token_fingerprint": self.token_fingerprint,
            "trace_id": self.trace_id,
        }

    def chain_hash(self, *, chain_seq: int, prev_hash: str) -> str:
        """SHA-256 (hex) of the RFC 8785 form of ``chain_form``."""
        form = self.chain_form(chain_seq=chain_seq, prev_hash=prev_hash)
        try:
            canonical = chain_canonical(form)
        except (rfc8785.IntegerDomainError, rfc8785.FloatDomainError):
            # ``data`` holds a number JSON cannot carry exactly (stored by the console's
            # own code, never from a request): hash its sorted JSON text instead.
            form["data"] = {"$json": json.dumps(self.data, sort_keys=True, ensure_ascii=False)}
            canonical = chain_canonical(form)
        return hashlib.sha256(canonical).hexdigest()


def chain_canonical(form: dict[str, Any]) -> bytes:
    """``rfc8785.dumps(form)`` for a ``chain_form``, four times faster (it runs once per
    event when the chain is extended and again when it is verified).

    The form's keys are fixed ASCII names, which RFC 8785 sorts as Python does; its values
    other than ``data`` are strings, integers and null, whose RFC 8785 text is exactly what
    ``json.dumps(value, ensure_ascii=False)`` writes (the same escapes, lowercase hex,
    nothing else escaped). ``data`` goes through ``rfc8785`` itself. The tests compare the two."""
    parts = []
    for key in sorted(form):
        value = form[key]
        if key == "data":
            text = rfc8785.dumps(value).decode("utf-8") if value else "{}"
        elif isinstance(value, str):
            text = encode_basestring(value)
        elif value is None:
            text = "null"
        elif isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > _MAX_SAFE_INTEGER:
                raise rfc8785.IntegerDomainError(value)
            text = str(value)
        else:
            return rfc8785.dumps(form)
        parts.append(f'"{key}":{text}')
    return ("{" + ",".join(parts) + "}").encode("utf-8")


_MAX_SAFE_INTEGER = 2**53 - 1


def _utc_text(moment: datetime) -> str:
    return stored_time_text(moment) or moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stored_time_text(moment: datetime) -> str:
    """PostgreSQL's text of a stored time Python cannot hold (before year 1 or after 9999 in
    UTC; ``config.postgresql.base.UnrepresentableTime``), or "" for any other time. The
    chain hashes and the export writes this text, never the stand-in Python was given."""
    return getattr(moment, "stored", "")


class AuditDuplicateDelivery(models.Model):
    """A producer event delivered again after the console had stored it.

    The event is stored once (``original``, with the ingestion and time of its first
    delivery); each later delivery is a row here, with the batch that brought it
    (``ingestion``: its id and ``received_at``), its line in that batch and the line as
    sent, so that an investigator can tell a duplicated audit delivery (one producer event
    id, several deliveries) from a replay (several events). Append-only.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    ingestion = models.ForeignKey(
        AuditIngestion, on_delete=models.PROTECT, related_name="duplicate_deliveries"
    )
    original = models.ForeignKey(
        AuditEvent, on_delete=models.PROTECT, related_name="duplicate_deliveries"
    )
    event_id = models.UUIDField(help_text="The producer's event id, the original's too.")
    line = models.PositiveIntegerField(help_text="Line number in the batch, from 1.")
    payload = models.JSONField(help_text="The line as delivered.")
    same_payload = models.BooleanField(
        help_text="Whether the line says what the stored event says."
    )

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["tenant", "event_id"], name="audit_duplicate_event")]

    def __str__(self) -> str:
        return f"duplicate delivery of {self.event_id} in ingestion {self.ingestion_id}"


class AuditChainHead(models.Model):
    """The newest link of a tenant's audit chain.

    Its row lock (``SELECT ... FOR UPDATE``) is what serializes extending the chain, so two
    writers can never give out one ``chain_seq`` twice. ``chained_through`` is an event id:
    every event of the tenant with an id up to it is chained.
    """

    tenant = models.OneToOneField(
        Tenant, on_delete=models.PROTECT, primary_key=True, related_name="audit_chain_head"
    )
    seq = models.PositiveBigIntegerField(default=0)
    hash = models.CharField(max_length=64, default=AUDIT_CHAIN_GENESIS)
    chained_through = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"audit chain of {self.tenant_id} at {self.seq}"
