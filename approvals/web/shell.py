"""The console's shell, shared by every page of both apps: sign-in, the header (tenant
switcher, the links each role gets), the admin pages' scope, and the notices and stamps
pages and their live fragments use."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timesince
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from approvals.errors import ErrorCode
from approvals.models import (
    Tenant,
)
from approvals.web.selectors.access import ConsoleAccess, console_access

SESSION_TENANT = "console_tenant"


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


_View = TypeVar("_View", bound=Callable[..., HttpResponse])


def console_login_required(view: _View) -> _View:
    """login_required that sends htmx requests to the sign-in page as a whole page, not
    as a fragment swapped into the panel."""

    @wraps(view)
    def wrapped(request: HtmxHttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        # After signing in, come back to a page, never to an action URL (GET there is 405).
        if request.htmx:
            target = request.htmx.current_url_abs_path or reverse("approvals:inbox")
            return HttpResponseClientRedirect(f"{settings.LOGIN_URL}?{urlencode({'next': target})}")
        target = request.get_full_path() if request.method == "GET" else reverse("approvals:inbox")
        return redirect_to_login(target)

    return wrapped  # type: ignore[return-value]


def _scope(request: HttpRequest, access: ConsoleAccess) -> Tenant | None:
    """The tenant chosen in the header, or None for all of the user's tenants."""
    slug = request.session.get(SESSION_TENANT)
    return next((t for t in access.tenants if t.slug == slug), None)


def header_links(access: ConsoleAccess) -> dict[str, bool]:
    """Which of the header's links the user gets: the operations console, the admin pages,
    Access tokens. Every page's header, the operations console's too."""
    return {
        "is_operator": bool(access.operator_tenant_ids),
        "is_admin_somewhere": any(access.is_admin(t.pk) for t in access.tenants),
        "is_reviewer_somewhere": any(access.is_reviewer(t.pk) for t in access.tenants),
    }


def header(access: ConsoleAccess) -> dict[str, Any]:
    """The header's links and the unread notifications' count (read with the roles: no
    query of its own): every page's, the operations console's too."""
    return {"unread_count": access.unread, **header_links(access)}


def chrome(request: HttpRequest, access: ConsoleAccess) -> dict[str, Any]:
    """What the header needs: the tenant switcher (it scopes the inbox), the links and the
    unread count (``header``)."""
    return {
        "tenants": access.tenants,
        "current_tenant": _scope(request, access),
        **header(access),
    }


def stamp(parts: Any) -> str:
    """A short name for what a polled fragment shows; equal names mean nothing changed."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Notice:
    level: str  # success, info, warning, error
    text: str


def refusal(code: ErrorCode, message: str) -> Notice:
    """A refused decision in the console's words. Losing a race to another reviewer is
    news, not an error: the request was decided, just not by this reviewer."""
    return Notice("info" if code == ErrorCode.NOT_PENDING else "error", REFUSALS.get(code, message))


def duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} minute{'' if minutes == 1 else 's'}"
    return f"{minutes // 60} hours" + (f" {minutes % 60} minutes" if minutes % 60 else "")


def input_errors(details: list[dict[str, Any]], field: str | None, message: str) -> list[str]:
    """An InputError's messages with ``arguments.`` taken off the field names."""
    if not details:
        return [_field_message(field, message)]
    return [_field_message(d.get("field"), d.get("message", "")) for d in details]


def _field_message(field: str | None, message: str) -> str:
    if field and field.startswith("arguments."):
        return f"{field.removeprefix('arguments.')}: {message}"
    return message


NOT_ADMIN = "Only admins of a tenant can revoke approvals and manage runtime keys."


@dataclass(frozen=True)
class AdminScope:
    """The signed-in user's access and the tenants where they are an admin."""

    request: HttpRequest
    access: ConsoleAccess
    tenants: list[Tenant]

    @property
    def tenant_ids(self) -> list[int]:
        return [t.pk for t in self.tenants]

    def tenant(self, slug: str) -> Tenant | None:
        return next((t for t in self.tenants if t.slug == slug), None)

    def context(self, section: str, **extra: Any) -> dict[str, Any]:
        """What every admin page's template needs: the header, the admin sub-navigation."""
        return {
            **chrome(self.request, self.access),
            "admin_section": section,
            "admin_tenants": self.tenants,
            "show_tenant": len(self.tenants) > 1,
            **extra,
        }


def admin_scope(request: HttpRequest, message: str = NOT_ADMIN) -> AdminScope:
    """The one access check of the admin pages: admins of at least one tenant, else 403."""
    access = console_access(request.user)
    tenants = [t for t in access.tenants if access.is_admin(t.pk)]
    if not tenants:
        raise PermissionDenied(message)
    return AdminScope(request, access, tenants)


def _utc(moment: datetime) -> str:
    return f"{timezone.localtime(moment, UTC):%Y-%m-%d %H:%M:%S} UTC"


# Refusals a reviewer can meet, said in the console's words.
REFUSALS = {
    ErrorCode.NOT_PENDING: "Another decision was recorded first; this is the current state.",
    ErrorCode.NOT_EDITABLE: (
        "This request can no longer be edited: it is no longer pending or unclaimed."
    ),
}


def age(then: datetime, now: datetime) -> str:
    if (now - then).total_seconds() < 60:
        return "just now"
    return timesince(then, now, depth=1) + " ago"
