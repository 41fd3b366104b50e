"""Tenants and who acts in them: members with roles, runtime keys (agents), reviewers'
personal access tokens, and each key's request counts per rate-limit window."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # Requests one runtime key may make per rate-limit window (``approvals.access.ratelimit``).
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
    # When an admin last deactivated it: within RUNTIME_KEY_REACTIVATION_HOURS it can be
    # reactivated. Null for an active key and for keys deactivated before this was kept.
    deactivated_at = models.DateTimeField(null=True, blank=True)
    # When the key last authenticated an API call, to the minute: written only when the
    # stored value is a minute old (``approvals.access.runtime_keys.runtime_key_authenticate``).
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


class RuntimeKeyUsage(models.Model):
    """What one runtime key did in one rate-limit window: its requests, and its refused
    claims with a token the tenant never issued. A counter row, updated by one atomic
    upsert per request (``approvals.access.ratelimit``) and deleted when the window is reported."""

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


class ReviewerTokenUsage(models.Model):
    """What one reviewer's access token did in one rate-limit window: its requests. The
    same counter as ``RuntimeKeyUsage`` (``approvals.access.ratelimit``): one atomic upsert
    per request, deleted when the window is reported."""

    reviewer_token = models.ForeignKey(
        ReviewerToken, on_delete=models.CASCADE, related_name="usage"
    )
    # The window's start in Unix seconds, a multiple of ``window_seconds``.
    window_start = models.BigIntegerField()
    window_seconds = models.PositiveIntegerField()
    # The limit the requests were held to (the tenant's, or the setting's).
    request_limit = models.PositiveIntegerField()
    requests = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["reviewer_token", "window_start"], name="reviewer_token_usage_window_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reviewer_token_id}@{self.window_start}: {self.requests}"
