"""Who is asked: reviewer groups of a tenant, and the versioned rules that route a tool's
requests to them (``approvals.routing``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from approvals.models.contracts import ToolContract
from approvals.models.tenancy import Tenant


class ReviewerGroup(models.Model):
    """People of one tenant asked together, and where the group hears of a request: a
    Slack incoming webhook, a Slack app (a bot token and a channel id: its messages are
    threaded), a signed generic webhook (all optional; the secrets stored encrypted)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="reviewer_groups")
    name = models.CharField(max_length=100)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, related_name="reviewer_groups", blank=True
    )
    # A Slack incoming-webhook URL is a secret (whoever holds it may post): encrypted.
    slack_webhook_encrypted = models.TextField(blank=True)
    # A Slack app's bot token (xoxb-…) is a secret too: encrypted, never shown again. The
    # channel its messages go to (an id such as C0123ABCD) is not.
    slack_bot_token_encrypted = models.TextField(blank=True)
    slack_channel_id = models.CharField(max_length=32, blank=True)
    webhook_url = models.URLField(max_length=2000, blank=True)
    webhook_secret_encrypted = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="reviewer_group_name_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"


class RoutingRule(models.Model):
    """A rule's identity: a name for one tool of one tenant. What it says is its current
    version; every change is a new version (``RoutingRuleVersion``), never an edit."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="routing_rules")
    tool = models.ForeignKey(ToolContract, on_delete=models.PROTECT, related_name="routing_rules")
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tool__name", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "tool", "name"], name="routing_rule_name_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.tool_id}/{self.name}"


class RoutingRuleVersion(models.Model):
    """One version of a rule, as it was written. A request records the version that routed
    it (``Occurrence.routed_by``), so the page says which rule asked whom, even after the
    rule changed. A band (``currency`` set) matches amounts above ``amount_over_minor`` and
    up to ``amount_up_to_minor`` in that currency; a rule without a band matches every
    request of the tool. An inactive version is the rule's removal."""

    rule = models.ForeignKey(RoutingRule, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    is_current = models.BooleanField(default=True)
    is_active = models.BooleanField(default=True)
    groups = models.ManyToManyField(ReviewerGroup, related_name="rule_versions", blank=True)
    fallback_group = models.ForeignKey(
        ReviewerGroup, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    currency = models.CharField(max_length=3, blank=True)
    amount_over_minor = models.BigIntegerField(null=True, blank=True)
    amount_up_to_minor = models.BigIntegerField(null=True, blank=True)
    # Denormalized from the rule, so that a proposal picks its version from one index.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    tool = models.ForeignKey(ToolContract, on_delete=models.PROTECT, related_name="+")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["rule", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["rule", "version"], name="routing_version_unique"),
            models.UniqueConstraint(
                fields=["rule"], condition=Q(is_current=True), name="routing_version_one_current"
            ),
            models.CheckConstraint(
                condition=Q(currency="")
                | Q(amount_over_minor__isnull=False)
                | Q(amount_up_to_minor__isnull=False),
                name="routing_band_has_bounds",
            ),
        ]
        indexes = [
            models.Index(
                fields=["tenant", "tool"],
                condition=Q(is_current=True, is_active=True),
                name="routing_version_current",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.rule_id} v{self.version}"

    @property
    def band(self) -> str:
        """The amount band in words (minor units; the page formats money itself)."""
        if not self.currency:
            return "every request"
        low, high = self.amount_over_minor, self.amount_up_to_minor
        if low is not None and high is not None:
            return f"{self.currency} above {low} up to {high}"
        if low is not None:
            return f"{self.currency} above {low}"
        return f"{self.currency} up to {high}"
