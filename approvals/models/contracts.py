"""Tool contracts: what a tool's arguments may be, how safe a replay of it is, who executes
it, and how many reviewers must approve it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

# Arguments that identify an action when a contract names none: besides every *_id.
_IDENTIFYING_NAMES = ("id", "recipient", "to", "case", "case_number", "order", "email")


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
    identifying_arguments = models.JSONField(
        default=list,
        blank=True,
        help_text="Arguments that say which action this is, shown where operators list "
        'calls: ["payment_id"]. Empty: every argument named *_id, and recipient, to, case.',
    )
    # Deadlines of a pending request, from its proposal: past the review deadline it is
    # escalated (marked, still reviewable); past the final deadline it ends ``timed_out``,
    # fail-closed. Empty: it waits until someone decides (as before deadlines existed).
    review_deadline = models.DurationField(
        null=True,
        blank=True,
        help_text="Escalate a request nobody decided within this time (e.g. 0:30:00). "
        "Empty: never escalated.",
    )
    final_deadline = models.DurationField(
        null=True,
        blank=True,
        help_text="End a request nobody decided within this time as timed out (fail-closed: "
        "nothing can approve it afterwards). Longer than the review deadline. Empty: never.",
    )
    sensitive_arguments = models.JSONField(
        default=list,
        blank=True,
        help_text="Arguments that never leave the console: notifications (e-mail, Slack, "
        'webhooks) leave them out. ["iban", "note"].',
    )
    # Bumped by ``tool_contract_register`` (approvals.contracts) each time a registration
    # changes the contract; each registration is audited with the version it made.
    version = models.PositiveIntegerField(
        default=1, help_text="Bumped by each registration that changes the contract."
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
            models.CheckConstraint(
                condition=Q(review_deadline__isnull=True) | Q(review_deadline__gt=timedelta(0)),
                name="contract_review_deadline_positive",
            ),
            models.CheckConstraint(
                condition=Q(final_deadline__isnull=True)
                | (
                    Q(final_deadline__gt=timedelta(0))
                    & (
                        Q(review_deadline__isnull=True)
                        | Q(final_deadline__gt=models.F("review_deadline"))
                    )
                ),
                name="contract_final_deadline_after_review",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from approvals.canonical.schema import check_contract_schema

        errors = check_contract_schema(self.json_schema)
        if errors:
            raise ValidationError({"json_schema": errors})
        if self.auto_admit and self.replay_safety != self.ReplaySafety.READ_ONLY:
            raise ValidationError({"auto_admit": "Only read-only tools may be auto-admitted."})
        self._clean_deadlines()
        properties = self.json_schema.get("properties", {})
        names = self.identifying_arguments
        if not isinstance(names, list) or any(n not in properties for n in names):
            raise ValidationError(
                {"identifying_arguments": "A list of the schema's argument names."}
            )
        hidden = self.sensitive_arguments
        if not isinstance(hidden, list) or any(n not in properties for n in hidden):
            raise ValidationError({"sensitive_arguments": "A list of the schema's argument names."})
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

    def _clean_deadlines(self) -> None:
        for field in ("review_deadline", "final_deadline"):
            value = getattr(self, field)
            if value is not None and value <= timedelta(0):
                raise ValidationError({field: "A deadline is a positive duration."})
        review, final = self.review_deadline, self.final_deadline
        if review is not None and final is not None and final <= review:
            raise ValidationError(
                {"final_deadline": "The final deadline must be later than the review deadline."}
            )

    def _clean_currency_quorum(self, properties: dict[str, Any]) -> None:
        from approvals.canonical.money import currency_exponent

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

    def identifying(self, arguments: dict[str, Any]) -> list[tuple[str, str]]:
        """The arguments that say which action a call is (a payment id, a recipient, a
        case), as (name, value) in the contract's order: ``identifying_arguments``, or by
        name when it names none."""
        names = self.identifying_arguments if isinstance(self.identifying_arguments, list) else []
        if not names:
            names = [n for n in arguments if n.endswith("_id") or n in _IDENTIFYING_NAMES]
        return [
            (name, str(arguments[name]))
            for name in names
            if isinstance(name, str) and arguments.get(name) not in (None, "", [], {})
        ]

    @property
    def executed_by(self) -> str:
        """Who executes a claimed call: the console when the contract names an adapter,
        otherwise the runtime (a ``Command.ExecutedBy`` value)."""
        return "console" if self.adapter else "runtime"
