"""Personal access tokens for deciding through the API: a reviewer's own, and, for a
tenant's admins, every member's token in that tenant.

Thin views over ``approvals.access.reviewer_tokens``. A token is shown once, on the response
that creates it (never cached); the lists show names, prefixes and dates only. An admin
revokes a member's token here (a reviewer who left, a token in a leaked log); the revocation
is audited with the admin as actor and the owner named.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.debug import sensitive_variables
from django.views.decorators.http import require_GET, require_POST

from approvals.access import reviewer_tokens
from approvals.access.reviewer_tokens import owner_reviews
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


# Members' tokens an admin's section lists, newest first: a tenant has a few per reviewer.
MEMBER_TOKENS_SHOWN = 200


@dataclass(frozen=True)
class TokenRow:
    token: ReviewerToken
    # active, expired, revoked, or orphaned: live, but its owner is no reviewer of its
    # tenant any more, so the API refuses it (``reviewer_token_authenticate``).
    status: str
    last_used: str


@dataclass(frozen=True)
class Account:
    request: HttpRequest
    access: ConsoleAccess
    tenants: list[Tenant]  # where the user is a reviewer
    admin_tenants: list[Tenant]  # where the user is an admin: members' tokens

    @property
    def admin_tenant_ids(self) -> list[int]:
        return [t.pk for t in self.admin_tenants]


def _account(request: HttpRequest) -> Account:
    access = console_access(request.user)
    tenants = [t for t in access.tenants if access.is_reviewer(t.pk)]
    admin_tenants = [t for t in access.tenants if access.is_admin(t.pk)]
    if not tenants and not admin_tenants:
        raise PermissionDenied(NOT_REVIEWER)
    return Account(request, access, tenants, admin_tenants)


def _rows(tokens: Any, now: datetime) -> list[TokenRow]:
    """Rows of tokens annotated with ``owner_reviews`` (``reviewer_tokens.owner_reviews``)."""

    def status(token: ReviewerToken) -> str:
        if token.revoked_at:
            return "revoked"
        if token.expires_at <= now:
            return "expired"
        return "active" if getattr(token, "owner_reviews", False) else "orphaned"

    return [
        TokenRow(
            token,
            status(token),
            age(token.last_used_at, now) if token.last_used_at else "never",
        )
        for token in tokens
    ]


def _render(
    account: Account,
    *,
    form: TokenCreateForm | None = None,
    created: ReviewerToken | None = None,
    raw: str = "",
    status: int = 200,
) -> HttpResponse:
    now = timezone.now()
    me = cast(int, account.request.user.pk)
    listed = ReviewerToken.objects.select_related("tenant").annotate(owner_reviews=owner_reviews())
    rows = _rows(listed.filter(user_id=me).order_by("revoked_at", "-created_at"), now)
    member_rows: list[TokenRow] = []
    if account.admin_tenants:
        members = (
            listed.filter(tenant_id__in=account.admin_tenant_ids)
            .exclude(user_id=me)
            .select_related("user")
            .order_by("revoked_at", "-created_at")
        )
        member_rows = _rows(members[:MEMBER_TOKENS_SHOWN], now)
    context = {
        **chrome(account.request, account.access),
        "rows": rows,
        "active_count": sum(1 for row in rows if row.status == "active"),
        "member_rows": member_rows,
        "member_rows_cut": len(member_rows) == MEMBER_TOKENS_SHOWN,
        "admin_tenants": account.admin_tenants,
        "may_create": bool(account.tenants),
        "form": form or TokenCreateForm(tenants=account.tenants),
        "show_tenant": len(account.tenants) > 1,
        "show_member_tenant": len(account.admin_tenants) > 1,
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
    if not account.tenants:
        raise PermissionDenied(NOT_REVIEWER)
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
    """The owner's token, or a member's in a tenant the user administers; else 404."""
    me = cast(int, request.user.pk)
    access = console_access(request.user)
    admin_of = [t.pk for t in access.tenants if access.is_admin(t.pk)]
    token = (
        ReviewerToken.objects.filter(Q(user_id=me) | Q(tenant_id__in=admin_of), pk=token_id)
        .select_related("tenant", "user")
        .first()
    )
    if token is None:
        raise Http404("No such access token of yours or of your tenants' members.")
    whose = "" if token.user_id == me else f" of {token.user.get_username()}"
    if reviewer_tokens.reviewer_token_revoke(token=token, user=request.user):  # type: ignore[arg-type]
        messages.success(
            request,
            f"Revoked access token {token.name} ({token.prefix}…){whose}. The API refuses it now.",
        )
    else:
        messages.info(
            request, f"Access token {token.name} ({token.prefix}…){whose} was already revoked."
        )
    return redirect("approvals:access-tokens")
