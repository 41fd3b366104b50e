"""Admins' runtime keys page (``/manage/keys/``): create a key (shown once), deactivate
one after a confirmation that names it, and reactivate it within the grace period."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.debug import sensitive_variables
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals.access.encryption import Purpose
from approvals.access.runtime_keys import (
    runtime_key_deactivate,
    runtime_key_issue,
    runtime_key_reactivate,
    runtime_key_reactivation_until,
)
from approvals.errors import InputError, ServiceError
from approvals.models import RuntimeKey, Tenant
from approvals.web.handoff import handoff_put, handoff_take
from approvals.web.shell import AdminScope, admin_scope, age, console_login_required, duration

TEMPLATE_KEYS = "approvals/keys.html"


TEMPLATE_KEY_CREATED = "approvals/keys_created.html"
TEMPLATE_KEY_DEACTIVATE = "approvals/keys_deactivate.html"

# The session entry that carries a new key, encrypted, from the POST to the one page that
# shows it (approvals.web.handoff).
HANDOFF = "runtime_key_handoff"


class KeyCreateForm(forms.Form):
    tenant = forms.ChoiceField(required=False)
    name = forms.CharField(
        max_length=100,
        error_messages={
            "required": "Give the key a name, e.g. the runtime that will use it.",
            "max_length": "Keep the name under 100 characters.",
        },
    )

    def __init__(self, data: Any = None, *, scope: AdminScope) -> None:
        super().__init__(data)
        self.scope = scope
        field = self.fields["tenant"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(t.slug, t.name) for t in scope.tenants]

    def chosen_tenant(self) -> Tenant:
        chosen = self.scope.tenant(self.cleaned_data.get("tenant") or "")
        return chosen or self.scope.tenants[0]

    def clean_tenant(self) -> str:
        slug: str = self.cleaned_data.get("tenant") or ""
        if not slug and len(self.scope.tenants) > 1:
            raise forms.ValidationError("Choose the tenant the key is for.")
        return slug


@dataclass(frozen=True)
class KeyRow:
    key: RuntimeKey
    last_used: str
    # Until when a deactivated key can be reactivated (None: it cannot).
    reactivable_until: datetime | None = None


def _render_keys(
    scope: AdminScope, *, form: KeyCreateForm | None = None, status: int = 200
) -> HttpResponse:
    now = timezone.now()
    keys = (
        RuntimeKey.objects.filter(tenant_id__in=scope.tenant_ids)
        .select_related("tenant")
        .order_by("tenant__name", "-is_active", "name")
    )
    rows = []
    for key in keys:
        until = runtime_key_reactivation_until(key)
        rows.append(
            KeyRow(
                key,
                age(key.last_used_at, now) if key.last_used_at else "never",
                until if until is not None and until > now else None,
            )
        )
    context = scope.context(
        "keys",
        rows=rows,
        active_count=sum(1 for row in rows if row.key.is_active),
        grace=duration(settings.RUNTIME_KEY_REACTIVATION_HOURS * 3600),
        form=form or KeyCreateForm(scope=scope),
    )
    return render(scope.request, TEMPLATE_KEYS, context, status=status)


@require_GET
@console_login_required
def keys(request: HttpRequest) -> HttpResponse:
    return _render_keys(admin_scope(request))


@sensitive_variables("raw")
@require_POST
@console_login_required
def keys_create(request: HttpRequest) -> HttpResponse:
    """Create a key and show it on this response only: the console keeps its hash, and the
    page is never cached."""
    scope = admin_scope(request)
    form = KeyCreateForm(request.POST, scope=scope)
    if not form.is_valid():
        return _render_keys(scope, form=form, status=422)
    tenant = form.chosen_tenant()
    try:
        key, raw = runtime_key_issue(
            tenant=tenant, name=form.cleaned_data["name"], admin=request.user
        )
    except InputError as exc:
        form.add_error("name", exc.message)
        return _render_keys(scope, form=form, status=422)
    except ServiceError as exc:
        raise PermissionDenied(exc.message) from exc
    # Post/redirect/get: a reload of the page that shows the key never posts again. The key
    # crosses the redirect in the session, encrypted, and the page takes it out.
    handoff_put(request, HANDOFF, subject=key.pk, secret=raw, purpose=Purpose.KEY_HANDOFF)
    return redirect("approvals:key-created", key_id=key.pk)


@sensitive_variables("raw")
@require_GET
@console_login_required
def key_created(request: HttpRequest, key_id: int) -> HttpResponse:
    """The new key, shown on this response only: taken out of the session as it is shown;
    a reload says it was shown already."""
    scope = admin_scope(request)
    key = (
        RuntimeKey.objects.filter(pk=key_id, tenant_id__in=scope.tenant_ids)
        .select_related("tenant")
        .first()
    )
    if key is None:
        raise Http404("No such runtime key in your tenants.")
    handoff = handoff_take(request, HANDOFF, subject=key.pk, purpose=Purpose.KEY_HANDOFF)
    raw = handoff.secret if handoff else ""
    response = render(
        request,
        TEMPLATE_KEY_CREATED,
        scope.context("keys", key=key, raw_key=raw, tenant=key.tenant),
    )
    add_never_cache_headers(response)
    return response


def _key_of(scope: AdminScope, key_id: int) -> RuntimeKey:
    key = (
        RuntimeKey.objects.filter(pk=key_id, tenant_id__in=scope.tenant_ids)
        .select_related("tenant")
        .first()
    )
    if key is None:
        raise Http404("No such runtime key in your tenants.")
    return key


@require_http_methods(["GET", "POST"])
@console_login_required
def key_deactivate(request: HttpRequest, key_id: int) -> HttpResponse:
    """GET asks for confirmation, naming the key and its last use (one click on the list
    deactivated a key in use); POST deactivates it."""
    scope = admin_scope(request)
    key = _key_of(scope, key_id)
    if request.method == "GET":
        if not key.is_active:
            messages.info(
                request, f"Runtime key {key.name} ({key.prefix}…) is already deactivated."
            )
            return redirect("approvals:keys")
        now = timezone.now()
        context = scope.context(
            "keys",
            key=key,
            last_used=age(key.last_used_at, now) if key.last_used_at else "",
            grace=duration(settings.RUNTIME_KEY_REACTIVATION_HOURS * 3600),
        )
        return render(request, TEMPLATE_KEY_DEACTIVATE, context)
    try:
        changed = runtime_key_deactivate(key=key, admin=request.user)
    except ServiceError as exc:
        raise PermissionDenied(exc.message) from exc
    if changed:
        messages.success(
            request,
            f"Deactivated runtime key {key.name} ({key.prefix}…) of {key.tenant.name}. "
            "The API now refuses it (401). You can reactivate it from this list for "
            f"{duration(settings.RUNTIME_KEY_REACTIVATION_HOURS * 3600)}.",
        )
    else:
        messages.info(request, f"Runtime key {key.name} ({key.prefix}…) was already deactivated.")
    return redirect("approvals:keys")


@require_POST
@console_login_required
def key_reactivate(request: HttpRequest, key_id: int) -> HttpResponse:
    """Undo a deactivation within the grace period; after it, the key stays deactivated."""
    scope = admin_scope(request)
    key = _key_of(scope, key_id)
    try:
        changed = runtime_key_reactivate(key=key, admin=request.user)
    except ServiceError as exc:
        raise PermissionDenied(exc.message) from exc
    if changed:
        messages.success(
            request,
            f"Reactivated runtime key {key.name} ({key.prefix}…) of {key.tenant.name}. "
            "The API accepts it again.",
        )
    elif key.is_active:
        messages.info(request, f"Runtime key {key.name} ({key.prefix}…) is active already.")
    else:
        messages.error(
            request,
            f"Runtime key {key.name} ({key.prefix}…) was deactivated more than "
            f"{duration(settings.RUNTIME_KEY_REACTIVATION_HOURS * 3600)} ago and cannot be "
            "reactivated: create a new key for the runtime.",
        )
    return redirect("approvals:keys")
