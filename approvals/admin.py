from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from approvals.access import reviewer_tokens
from approvals.models import (
    Approval,
    AuditEvent,
    Command,
    Epoch,
    Membership,
    Occurrence,
    Proposal,
    ReviewerToken,
    RuntimeKey,
    Tenant,
    ToolContract,
)
from approvals.reviews.revocation import approvals_revoke


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role", "tenant"]


@admin.register(RuntimeKey)
class RuntimeKeyAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "prefix",
        "runtime_group",
        "is_active",
        "last_used_at",
        "created_at",
    ]
    list_filter = ["is_active", "tenant"]
    # Keys are created with `manage.py create_runtime_key` or on the console's runtime keys
    # page (/manage/keys/), which show the raw key once.
    readonly_fields = ["tenant", "key_hash", "prefix", "created_at", "last_used_at"]
    # Keys with the same runtime group share token pickups and claims (one runtime).
    fields = [
        "tenant",
        "name",
        "prefix",
        "runtime_group",
        "is_active",
        "key_hash",
        "created_at",
        "last_used_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ReviewerToken)
class ReviewerTokenAdmin(admin.ModelAdmin):
    """Reviewers create their tokens on the console's Access tokens page (shown once);
    here a superuser sees them and revokes, e.g. a reviewer's who left."""

    list_display = ["name", "user", "tenant", "prefix", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["tenant"]
    search_fields = ["name", "prefix", "user__username"]
    exclude = ["token_hash"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [f.name for f in ReviewerToken._meta.fields if f.name != "token_hash"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ReviewerToken]) -> None:
        revoked = sum(
            reviewer_tokens.reviewer_token_revoke(token=token, user=request.user, by_superuser=True)  # type: ignore[arg-type]
            for token in queryset.select_related("user", "tenant")
        )
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)


@admin.register(ToolContract)
class ToolContractAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "replay_safety",
        "risk",
        "auto_admit",
        "approvals_required",
        "review_deadline",
        "final_deadline",
    ]
    list_filter = ["replay_safety", "risk"]


class ProposalInline(admin.TabularInline):
    model = Proposal
    extra = 0
    can_delete = False
    fields = ("version", "action_digest", "is_current", "canonical_action", "created_at")
    readonly_fields = fields


@admin.register(Occurrence)
class OccurrenceAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "tool", "status", "run_id", "requested_by", "created_at"]
    list_filter = ["status", "tool", "tenant"]
    search_fields = ["id", "run_id", "client_ref"]
    inlines = [ProposalInline]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [f.name for f in Occurrence._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = ["fingerprint", "tenant", "tool_name", "approver", "state", "expires_at"]
    list_filter = ["state", "tenant", "tool_name"]
    search_fields = ["fingerprint"]
    exclude = ["token_hash"]
    actions = ["revoke_selected"]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [f.name for f in Approval._meta.fields if f.name != "token_hash"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # A deleted approval would turn a revocation into unknown_token: revoke instead.
        return False

    @admin.action(description="Revoke selected approvals (kill switch)")
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        count = approvals_revoke(
            approvals=queryset,
            actor=str(request.user.get_username()),
            reason="Revoked from the Django admin.",
        )
        self.message_user(request, f"Revoked {count} approval(s).", messages.SUCCESS)


class EvidenceAdmin(admin.ModelAdmin):
    """Commands and epochs are made only by a claim: one approval, one command. Adding or
    deleting them by hand would break that, so the admin only shows them."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Command)
class CommandAdmin(EvidenceAdmin):
    list_display = ["id", "tenant", "execution_id", "idempotency_key", "state", "created_at"]
    list_filter = ["state", "tenant"]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [f.name for f in Command._meta.fields]


@admin.register(Epoch)
class EpochAdmin(EvidenceAdmin):
    list_display = ["occurrence", "number", "execution_id", "justification", "created_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [f.name for f in Epoch._meta.fields]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Read-only: no add, no change, no delete, and no actions at all (so no bulk
    "delete selected" either). The database refuses UPDATE and DELETE too (a trigger)."""

    list_display = ["id", "kind", "tenant", "decision", "reason_code", "actor", "source_time"]
    list_filter = ["kind", "decision", "tenant"]
    search_fields = ["event_id", "execution_id", "token_fingerprint", "trace_id"]
    actions = None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
