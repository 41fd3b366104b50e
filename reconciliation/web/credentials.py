"""The admins' adapter credentials page: per tenant and adapter, when the secret was last
replaced and by whom (never the secret), and a form to replace it.

It lives here, not in ``approvals``, because replacing a credential is what restores authority after
an authentication challenge: ``reconciliation.credential_refresh.credential_replace`` records
``credentials.refreshed`` and admits a new epoch for each interrupted command where the evidence
allows it, and ``approvals`` never imports ``reconciliation``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables
from django.views.decorators.http import require_http_methods

from approvals.errors import ServiceError
from approvals.models import Tenant, ToolContract
from approvals.web.shell import AdminScope, admin_scope, age, console_login_required
from reconciliation import adapters
from reconciliation.credential_refresh import credential_replace
from reconciliation.models import AdapterCredential, Interruption

TEMPLATE = "reconciliation/credentials.html"
NOT_ADMIN = "Only admins of a tenant can replace adapter credentials."


class CredentialReplaceForm(forms.Form):
    tenant = forms.CharField(max_length=64)
    adapter = forms.ChoiceField(choices=[(name, name) for name in adapters.NAMES])
    # Never re-rendered: the page shows an empty password input, always.
    secret = forms.CharField(
        max_length=4096,
        widget=forms.PasswordInput(render_value=False),
        error_messages={"required": "Enter the new secret."},
    )


@dataclass(frozen=True)
class CredentialCard:
    """One adapter of one tenant, as the page shows it: never the secret."""

    tenant: Tenant
    adapter: str
    tools: list[str]
    replaced_at: datetime | None
    replaced_ago: str
    replaced_by: str
    waiting: int  # commands stopped by an authentication challenge, not yet resumed

    @property
    def form_id(self) -> str:
        return f"credential-{self.tenant.slug}-{self.adapter}"


def _cards(scope: AdminScope) -> list[CredentialCard]:
    """Every adapter of every tenant the user administers, in three queries."""
    now = timezone.now()
    stored = {
        (c.tenant_id, c.adapter): c
        for c in AdapterCredential.objects.filter(tenant_id__in=scope.tenant_ids).only(
            "tenant_id", "adapter", "updated_at", "updated_by"
        )
    }
    waiting = Counter(
        {
            (row["command__tenant_id"], row["command__occurrence__tool__adapter"]): row["n"]
            for row in Interruption.objects.filter(
                resolved_at__isnull=True,
                kind=Interruption.Kind.AUTH_CHALLENGE,
                command__tenant_id__in=scope.tenant_ids,
            )
            .values("command__tenant_id", "command__occurrence__tool__adapter")
            .annotate(n=Count("pk"))
        }
    )
    tools: dict[str, list[str]] = {}
    for name, adapter in ToolContract.objects.exclude(adapter="").values_list("name", "adapter"):
        tools.setdefault(adapter, []).append(name)
    cards = []
    for tenant in scope.tenants:
        for adapter in adapters.NAMES:
            credential = stored.get((tenant.pk, adapter))
            replaced_at = credential.updated_at if credential else None
            cards.append(
                CredentialCard(
                    tenant=tenant,
                    adapter=adapter,
                    tools=sorted(tools.get(adapter, [])),
                    replaced_at=replaced_at,
                    replaced_ago=age(replaced_at, now) if replaced_at else "",
                    replaced_by=credential.updated_by if credential else "",
                    waiting=waiting[(tenant.pk, adapter)],
                )
            )
    return cards


def _render(
    scope: AdminScope,
    *,
    form: CredentialReplaceForm | None = None,
    status: int = 200,
) -> HttpResponse:
    context: dict[str, Any] = scope.context(
        "credentials",
        cards=_cards(scope),
        failed_form=form,
        failed_key=(form.data.get("tenant"), form.data.get("adapter")) if form else None,
        failed_error=next(iter(form.errors.values()))[0] if form and form.errors else "",
    )
    return render(scope.request, TEMPLATE, context, status=status)


@sensitive_post_parameters("secret")
@sensitive_variables("secret")
@require_http_methods(["GET", "POST"])
@console_login_required
def credentials(request: HttpRequest) -> HttpResponse:
    scope = admin_scope(request, NOT_ADMIN)
    if request.method == "GET":
        return _render(scope)
    form = CredentialReplaceForm(request.POST)
    if not form.is_valid():
        return _render(scope, form=form, status=422)
    tenant = scope.tenant(form.cleaned_data["tenant"])
    if tenant is None:
        raise PermissionDenied(NOT_ADMIN)
    adapter = form.cleaned_data["adapter"]
    secret = form.cleaned_data["secret"]
    try:
        outcomes = credential_replace(
            tenant=tenant, adapter=adapter, secret=secret, actor=request.user.get_username()
        )
    except ServiceError as exc:
        form.add_error("secret", exc.message)
        return _render(scope, form=form, status=422)
    admitted = sum(1 for outcome in outcomes if not isinstance(outcome, ServiceError))
    waiting = len(outcomes) - admitted
    text = f"Saved the new {adapter} credential of {tenant.name}. "
    if outcomes:
        text += (
            f"{admitted} interrupted command{'s' if admitted != 1 else ''} got a new epoch; "
            f"{waiting} wait{'s' if waiting == 1 else ''} for reconciliation in Operations."
        )
    else:
        text += "No command was waiting for it."
    messages.success(request, text)
    return redirect("reconciliation:credentials")
