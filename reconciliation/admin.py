"""Django admin for execution evidence (read-only) and for adapter secrets (write-only).

A secret is typed once and never shown again: the forms take it in a password field, the
lists show only when and by whom it was replaced. Replacing a credential goes through
``reconciliation.credential_refresh.credential_replace``, which records ``credentials.refreshed``
and admits new epochs only where the evidence allows.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Model
from django.http import HttpRequest

from approvals.errors import ServiceError
from reconciliation import adapters
from reconciliation.credential_refresh import credential_replace
from reconciliation.credentials import encrypt
from reconciliation.models import (
    AdapterCredential,
    AdapterInvocation,
    EpochAdmission,
    Escalation,
    EscalationPolicy,
    Interruption,
    WebhookTarget,
)


class _ReadOnly(admin.ModelAdmin):
    """Evidence: looked at, never edited or deleted."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AdapterInvocation)
class AdapterInvocationAdmin(_ReadOnly):
    list_display = ["command", "number", "kind", "justification", "outcome", "started_at"]
    list_filter = ["kind", "outcome"]
    search_fields = ["command__id", "receipt", "message_id"]


@admin.register(Interruption)
class InterruptionAdmin(_ReadOnly):
    list_display = ["command", "kind", "created_at", "resolved_at"]
    list_filter = ["kind"]


@admin.register(EpochAdmission)
class EpochAdmissionAdmin(_ReadOnly):
    list_display = ["epoch", "justification", "decided_by", "created_at"]
    list_filter = ["justification"]


class CredentialForm(forms.ModelForm):
    secret = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        help_text="The new secret. It is stored encrypted and never shown again.",
    )
    adapter = forms.ChoiceField(choices=[(name, name) for name in adapters.NAMES])

    class Meta:
        model = AdapterCredential
        fields = ["tenant", "adapter"]


@admin.register(AdapterCredential)
class AdapterCredentialAdmin(admin.ModelAdmin):
    form = CredentialForm
    list_display = ["tenant", "adapter", "updated_at", "updated_by"]
    readonly_fields = ["updated_at", "updated_by"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Replacing a secret keeps its tenant and adapter.
        return [*self.readonly_fields, "tenant", "adapter"] if obj else self.readonly_fields

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["tenant", "adapter", "secret", "updated_at", "updated_by"]

    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        assert isinstance(obj, AdapterCredential)
        try:
            outcomes = credential_replace(
                tenant=obj.tenant,
                adapter=obj.adapter,
                secret=form.cleaned_data["secret"],
                actor=request.user.get_username(),
            )
        except ServiceError as exc:
            messages.error(request, exc.message)
            return
        admitted = [o for o in outcomes if not isinstance(o, ServiceError)]
        waiting = len(outcomes) - len(admitted)
        if outcomes:
            messages.info(
                request,
                f"{len(admitted)} interrupted command(s) got a new epoch; "
                f"{waiting} wait for reconciliation.",
            )
        # The service saved the row; the admin's log entry and redirect need its key.
        saved = AdapterCredential.objects.get(tenant=obj.tenant, adapter=obj.adapter)
        obj.pk = saved.pk
        obj.refresh_from_db()


class WebhookForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https")
    secret = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        help_text="The HMAC secret that signs each message. Stored encrypted, never shown.",
    )

    class Meta:
        model = WebhookTarget
        fields = ["tenant", "url"]


@admin.register(WebhookTarget)
class WebhookTargetAdmin(admin.ModelAdmin):
    form = WebhookForm
    list_display = ["tenant", "url", "updated_at"]
    fields = ["tenant", "url", "secret"]

    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        assert isinstance(obj, WebhookTarget)
        obj.secret_encrypted = encrypt(form.cleaned_data["secret"])
        super().save_model(request, obj, form, change)


class EscalationForm(forms.ModelForm):
    webhook_url = forms.URLField(max_length=500, required=False, assume_scheme="https")
    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="HMAC secret that signs each escalation. Leave empty to keep the saved one.",
    )

    class Meta:
        model = EscalationPolicy
        fields = ["tenant", "after_minutes", "webhook_url", "email"]


@admin.register(EscalationPolicy)
class EscalationPolicyAdmin(admin.ModelAdmin):
    form = EscalationForm
    list_display = ["tenant", "after_minutes", "webhook_url", "email"]
    fields = ["tenant", "after_minutes", "webhook_url", "secret", "email"]

    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        assert isinstance(obj, EscalationPolicy)
        if form.cleaned_data.get("secret"):
            obj.secret_encrypted = encrypt(form.cleaned_data["secret"])
        super().save_model(request, obj, form, change)


@admin.register(Escalation)
class EscalationAdmin(_ReadOnly):
    list_display = ["item_key", "tenant", "reason", "delivered", "attempts", "created_at"]
    list_filter = ["reason", "delivered"]
