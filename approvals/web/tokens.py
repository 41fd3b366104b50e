"""A reviewer's own page: personal access tokens for deciding through the API.

Thin views over ``approvals.access.reviewer_tokens``. A token is shown once, on the response
that creates it (never cached); the list shows names, prefixes and dates only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.debug import sensitive_variables
from django.views.decorators.http import require_GET, require_POST

from approvals.access import reviewer_tokens
from approvals.errors import InputError, ServiceError
from approvals.models import ReviewerToken, Tenant
from approvals.web.selectors.access import ConsoleAccess, console_access
from approvals.web.shell import age, chrome, console_login_required

TEMPLATE = "approvals/access_tokens.html"
NOT_REVIEWER = "Access tokens are for reviewers: you are not a reviewer of any tenant."


class TokenCreateForm(forms.Form):
    tenant = forms.ChoiceField(required=False)
    name = forms.CharField(
        max_length=100,
        error_messages={
            "required": "Give the token a name, e.g. the tool or script that will use it.",
            "max_length": "Keep the name under 100 characters.",
        },
    )
    lifetime_days = forms.TypedChoiceField(
        coerce=int,
        choices=[(d, f"{d} days") for d in reviewer_tokens.LIFETIME_DAYS],
        initial=30,
        error_messages={"invalid_choice": "A token lives 7, 30 or 90 days."},
    )

    def __init__(self, data: Any = None, *, tenants: list[Tenant]) -> None:
        super().__init__(data)
        self.tenants = tenants
        field = self.fields["tenant"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(t.slug, t.name) for t in tenants]

    def clean_tenant(self) -> str:
        slug: str = self.cleaned_data.get("tenant") or ""
        if not slug and len(self.tenants) > 1:
            raise forms.ValidationError("Choose the tenant the token decides in.")
        if slug and not any(t.slug == slug for t in self.tenants):
            raise forms.ValidationError("You are not a reviewer of that tenant.")
        return slug

    def chosen_tenant(self) -> Tenant:
        slug = self.cleaned_data.get("tenant") or ""
        return next((t for t in self.tenants if t.slug == slug), self.tenants[0])


@dataclass(frozen=True)
class TokenRow:
    token: ReviewerToken
    status: str  # active, expired, revoked
    last_used: str


@dataclass(frozen=True)
class Account:
    request: HttpRequest
    access: ConsoleAccess
    tenants: list[Tenant]  # where the user is a reviewer


def _account(request: HttpRequest) -> Account:
    access = console_access(request.user)
    tenants = [t for t in access.tenants if access.is_reviewer(t.pk)]
    if not tenants:
        raise PermissionDenied(NOT_REVIEWER)
    return Account(request, access, tenants)


def _render(
    account: Account,
    *,
    form: TokenCreateForm | None = None,
    created: ReviewerToken | None = None,
    raw: str = "",
    status: int = 200,
) -> HttpResponse:
    now = timezone.now()
    tokens = ReviewerToken.objects.filter(
        user_id=cast(int, account.request.user.pk)
    ).select_related("tenant")
    rows = [
        TokenRow(
            token,
            "revoked" if token.revoked_at else ("expired" if token.expires_at <= now else "active"),
            age(token.last_used_at, now) if token.last_used_at else "never",
        )
        for token in tokens.order_by("revoked_at", "-created_at")
    ]
    context = {
        **chrome(account.request, account.access),
        "rows": rows,
        "active_count": sum(1 for row in rows if row.status == "active"),
        "form": form or TokenCreateForm(tenants=account.tenants),
        "show_tenant": len(account.tenants) > 1,
        "created": created,
        "raw_token": raw,
    }
    response = render(account.request, TEMPLATE, context, status=status)
    if raw:
        add_never_cache_headers(response)
    return response


@require_GET
@console_login_required
def access_tokens(request: HttpRequest) -> HttpResponse:
    return _render(_account(request))


@sensitive_variables("raw")
@require_POST
@console_login_required
def access_token_create(request: HttpRequest) -> HttpResponse:
    """Create a token and show it on this response only."""
    account = _account(request)
    form = TokenCreateForm(request.POST, tenants=account.tenants)
    if not form.is_valid():
        return _render(account, form=form, status=422)
    try:
        token, raw = reviewer_tokens.reviewer_token_issue(
            user=request.user,  # type: ignore[arg-type]
            tenant=form.chosen_tenant(),
            name=form.cleaned_data["name"],
            lifetime_days=form.cleaned_data["lifetime_days"],
        )
    except InputError as exc:
        form.add_error("name", exc.message)
        return _render(account, form=form, status=422)
    except ServiceError as exc:
        raise PermissionDenied(exc.message) from exc
    return _render(account, created=token, raw=raw, status=201)


@require_POST
@console_login_required
def access_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = (
        ReviewerToken.objects.filter(pk=token_id, user_id=cast(int, request.user.pk))
        .select_related("tenant", "user")
        .first()
    )
    if token is None:
        raise Http404("No such access token of yours.")
    if reviewer_tokens.reviewer_token_revoke(token=token, user=request.user):  # type: ignore[arg-type]
        messages.success(
            request, f"Revoked access token {token.name} ({token.prefix}…). The API refuses it now."
        )
    else:
        messages.info(request, f"Access token {token.name} ({token.prefix}…) was already revoked.")
    return redirect("approvals:access-tokens")
