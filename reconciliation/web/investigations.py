"""The investigation page: from one id (token fingerprint, execution, command or
occurrence) to the joined chain of evidence and a verdict. Operators and admins of a tenant
see their tenants' records only; everyone else is refused.

A search is a POST, answered with a redirect to the page of what may be named: whatever was
typed (a live token pasted by mistake) never reaches an address, and so never a browser's
history, a proxy's or the server's access log. The page itself answers GET ``?q=``, which
other pages link to with fingerprints and ids."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from approvals.web.selectors.access import ConsoleAccess, console_memberships
from approvals.web.shell import console_login_required, header
from reconciliation.investigations.access import QueryRead, investigator_access, query_read
from reconciliation.investigations.gather import investigation_get
from reconciliation.investigations.page import investigation_page

TEMPLATE = "reconciliation/investigation.html"


def _refused(request: HttpRequest, read: QueryRead) -> HttpResponse | None:
    """The redirect for a query that is not searched as typed: a raw approval token (its
    fingerprint is searched instead) or a secret the console refuses to read."""
    here = reverse("reconciliation:investigations")
    if read.fingerprint_of_token:
        # Never keep a raw token in the address bar, the history or the page.
        messages.warning(
            request,
            "You searched with a raw approval token: it was replaced by its fingerprint and "
            "is not shown. Treat the token as exposed, and revoke it if it is still issued.",
        )
        return redirect(f"{here}?{urlencode({'q': read.fingerprint_of_token})}")
    if read.refusal:
        messages.error(request, read.refusal)
        return redirect(here)
    return None


@require_http_methods(["GET", "POST"])
@console_login_required
def investigation(request: HttpRequest) -> HttpResponse:
    memberships = console_memberships(request.user)
    access = investigator_access(memberships)
    if not access.tenant_ids:
        raise PermissionDenied("Only operators and admins of a tenant can investigate.")
    if request.method == "POST":
        read = query_read(request.POST.get("q", ""))
        here = reverse("reconciliation:investigations")
        return _refused(request, read) or redirect(
            f"{here}?{urlencode({'q': read.q})}" if read.q else here
        )
    read = query_read(request.GET.get("q", ""))
    refused = _refused(request, read)
    if refused is not None:
        return refused
    context = {**header(ConsoleAccess(memberships)), "q": read.q}
    if read.q:
        found = investigation_get(q=read.q, tenant_ids=access.tenant_ids)
        context["found"] = found.found
        if found.found:
            context.update(
                investigation_page(
                    found,
                    operator_tenant_ids=access.operator_tenant_ids,
                    show_tenant=len(access.tenant_ids) > 1,
                    # ?steps=all: every step read, not only the newest and the decisive.
                    every_step=request.GET.get("steps") == "all",
                )
            )
    return render(request, TEMPLATE, context)
