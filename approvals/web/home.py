"""Where each role starts: signing in (or opening ``/``) lands a reviewer in the inbox, an
operator in the operations queue and an admin on the admin pages; and the admin pages'
old addresses under ``/operations/``, which now answer from ``/manage/``."""

from __future__ import annotations

from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from approvals.web.selectors.access import ConsoleAccess, console_access
from approvals.web.shell import console_login_required

# The admin pages' prefix: not Django's own /admin/, which the site admin holds.
MANAGE_PREFIX = "/manage/"


def role_home(access: ConsoleAccess) -> str:
    """The page a user's roles start on. A reviewer's work waits in the inbox, so a
    reviewer starts there whatever else they are; then an operator's queue; then an
    admin's pages. Nobody with a role: the inbox, which says so."""
    if any(access.is_reviewer(t.pk) for t in access.tenants):
        return reverse("approvals:inbox")
    if access.operator_tenant_ids:
        # By name: the operations console belongs to reconciliation, which approvals
        # does not import.
        return reverse("reconciliation:queue")
    if any(access.is_admin(t.pk) for t in access.tenants):
        return reverse("approvals:manage")
    return reverse("approvals:inbox")


# What a link back to each home says.
HOME_LABELS = {
    "approvals:inbox": "Back to the inbox",
    "reconciliation:queue": "Back to the operations queue",
    "approvals:manage": "Back to the admin pages",
}


def role_home_label(url: str) -> str:
    return next((label for name, label in HOME_LABELS.items() if reverse(name) == url), "Back")


@require_GET
@console_login_required
def home(request: HttpRequest) -> HttpResponse:
    return redirect(role_home(console_access(request.user)))


@require_GET
@console_login_required
def manage(request: HttpRequest) -> HttpResponse:
    """The admin's home: revoking approvals, the first of the admin pages."""
    return redirect("approvals:revocations")


class ConsoleLoginView(LoginView):
    """Django's sign-in, landing on the user's role home unless ``next`` names a page."""

    redirect_authenticated_user = True

    def get_default_redirect_url(self) -> str:
        if self.next_page:
            return str(super().get_default_redirect_url())
        return role_home(console_access(self.request.user))


def moved(request: HttpRequest, new: str, rest: str = "") -> HttpResponse:
    """An admin page that moved from ``/operations/`` to ``/manage/``: a GET is told for
    good (301), any other method keeps its method and body at the new address (307), so a
    form rendered before the move still posts."""
    target = f"{new}{rest}"
    if request.META.get("QUERY_STRING"):
        target = f"{target}?{request.META['QUERY_STRING']}"
    if request.method in ("GET", "HEAD"):
        return HttpResponseRedirect(target, status=301)
    return HttpResponseRedirect(target, status=307)
