"""The reviewer console: server-rendered pages whose htmx fragments come from the same
templates. A view opens the occurrence through ``_open`` (which checks access), calls one
service, and re-renders from the database whether the action won or lost. What a page
shows is assembled in ``approvals.presenters``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget
from django_htmx.middleware import HtmxDetails

from approvals import presenters
from approvals.canonical.parsing import parse_json
from approvals.errors import InputError, ServiceError
from approvals.forms import (
    STATE_ALL,
    ApproveForm,
    EditForm,
    InboxFilterForm,
    ReasonForm,
    TenantSwitchForm,
)
from approvals.models import Membership, Occurrence, Tenant
from approvals.presenters import Notice, refusal
from approvals.reviews.decisions import occurrence_approve, occurrence_reject, proposal_edit
from approvals.reviews.revocation import approval_revoke
from approvals.reviews.selectors import current_proposal
from approvals.selectors import (
    ConsoleAccess,
    HistoryCursor,
    InboxFreshness,
    InboxQuery,
    PanelState,
    console_access,
    freshness_get,
    inbox_last_event,
    inbox_page,
    inbox_tools,
    inbox_total,
    occurrence_decision,
    review_get,
    review_snapshot,
)

SESSION_TENANT = "console_tenant"
INBOX_PAGE_SIZE = 25
REVIEW_TEMPLATE = "approvals/review.html"


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


# --- who may see what -----------------------------------------------------------------


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


def _chrome(request: HttpRequest, access: ConsoleAccess) -> dict[str, Any]:
    """What the header needs: the tenant switcher (it scopes the inbox), and the links."""
    return {
        "tenants": access.tenants,
        "current_tenant": _scope(request, access),
        **header_links(access),
    }


_REQUIRED: dict[str, str] = {
    Membership.Role.REVIEWER: "Only reviewers of this tenant can decide or edit requests.",
    Membership.Role.ADMIN: "Only admins of this tenant can revoke approvals.",
}


def _viewer(request: HttpRequest, access: ConsoleAccess, tenant_id: int) -> presenters.Viewer:
    return presenters.Viewer(
        username=request.user.get_username(),
        is_reviewer=access.is_reviewer(tenant_id),
        is_admin=access.is_admin(tenant_id),
    )


@dataclass(frozen=True)
class Opened:
    """An occurrence the signed-in user may see, with their roles in its tenant."""

    request: HttpRequest
    access: ConsoleAccess
    occurrence: Occurrence

    @property
    def viewer(self) -> presenters.Viewer:
        return _viewer(self.request, self.access, self.occurrence.tenant_id)

    def reload(self) -> Opened:
        """Read the occurrence again: after a write, the page shows the database's state."""
        return _open(self.request, self.occurrence.pk, access=self.access)


def _open(
    request: HttpRequest, occurrence_id: Any, *, role: str = "", access: ConsoleAccess | None = None
) -> Opened:
    """The one access check: another tenant's occurrence looks like no occurrence (404),
    and a missing ``role`` in its tenant is refused (403)."""
    access = access or console_access(request.user)
    occurrence = review_get(occurrence_id=occurrence_id, tenant_ids=access.tenant_ids)
    if occurrence is None:
        raise Http404("No such request in your tenants.")
    if role == Membership.Role.REVIEWER and not access.is_reviewer(occurrence.tenant_id):
        raise PermissionDenied(_REQUIRED[role])
    if role == Membership.Role.ADMIN and not access.is_admin(occurrence.tenant_id):
        raise PermissionDenied(_REQUIRED[role])
    return Opened(request, access, occurrence)


# --- inbox -----------------------------------------------------------------------------


@require_GET
@console_login_required
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    access = console_access(request.user)
    scope = _scope(request, access)
    contracts = inbox_tools()
    tools = {contract.name: contract.pk for contract in contracts.values()}
    form = InboxFilterForm(request.GET, tools=list(tools))
    tool, state = form.filters()
    tenant_ids = [scope.pk] if scope else access.tenant_ids
    query = InboxQuery(
        tenant_ids=tenant_ids,
        tool_id=tools.get(tool),
        status="" if state == STATE_ALL else state,
    )
    # The stamp first, from two aggregates: a poll that finds nothing new ends here.
    total, last_change = inbox_total(query)
    # The paginator only numbers the pages (of ``total`` rows, just read for the stamp):
    # ``inbox_page`` reads the rows of the one shown.
    page = Paginator(range(total), INBOX_PAGE_SIZE).get_page(request.GET.get("page"))
    number = page.number
    offset = (number - 1) * INBOX_PAGE_SIZE
    fresh = InboxFreshness(
        total=total,
        last_change=last_change,
        last_event_id=inbox_last_event(query, offset=offset, limit=INBOX_PAGE_SIZE),
    )
    rendered = presenters.inbox_stamp(
        fresh, tenant_ids=tenant_ids, tool=tool, state=state, page=number, now=timezone.now()
    )
    if request.htmx and request.GET.get("rendered") == rendered:
        return HttpResponse(status=204)

    listing = presenters.inbox_list(
        inbox_page(
            query,
            offset=offset,
            limit=INBOX_PAGE_SIZE,
            tools=contracts,
            tenants=access.tenants,
        ),
        tool=tool,
        state=state,
        page=number,
        total=total,
        rendered=rendered,
    )
    context = {
        **_chrome(request, access),
        **listing,
        "form": form,
        "tool_choices": form.tool_choices,
        "page": page,
        "show_tenant": scope is None and len(access.tenants) > 1,
        "has_access": bool(access.tenants),
    }
    if request.htmx and not request.htmx.history_restore_request:
        return render(request, "approvals/inbox.html#inbox-list", context)
    return render(request, "approvals/inbox.html", context)


@require_POST
@console_login_required
def switch_tenant(request: HtmxHttpRequest) -> HttpResponse:
    access = console_access(request.user)
    form = TenantSwitchForm(request.POST)
    form.is_valid()
    slug = form.cleaned_data.get("tenant", "")
    if slug and any(t.slug == slug for t in access.tenants):
        request.session[SESSION_TENANT] = slug
    else:
        request.session.pop(SESSION_TENANT, None)
    target = form.cleaned_data.get("next") or reverse("approvals:inbox")
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = reverse("approvals:inbox")
    return redirect(target)


# --- review page -----------------------------------------------------------------------


def _panel(opened: Opened, shown_digest: str = "") -> presenters.DecisionPanel:
    # The window of the history the page (or its poll) asks for with ?before= or ?after=;
    # the answer to a decision, posted without either, shows the newest events.
    query = opened.request.GET
    cursor = HistoryCursor.parse(query.get("before"), query.get("after"))
    snapshot = review_snapshot(opened.occurrence, cursor=cursor)
    return presenters.decision_panel(snapshot, opened.viewer, shown_digest=shown_digest)


def _render_review(
    opened: Opened,
    *,
    template: str = REVIEW_TEMPLATE,
    status: int = 200,
    since_digest: str = "",
    notice: Notice | None = None,
    edit_form: EditForm | None = None,
    edit_errors: list[str] | None = None,
    reject_form: ReasonForm | None = None,
    revoke_form: ReasonForm | None = None,
) -> HttpResponse:
    """The whole review page (or its body), read from the database as it is now."""
    panel = _panel(opened)
    context = {
        **_chrome(opened.request, opened.access),
        **panel.context(),
        **presenters.review_page(panel, since_digest=since_digest),
        "notice": notice,
        "reject_form": reject_form,
        "revoke_form": revoke_form,
        "edit_form": edit_form or EditForm(initial=presenters.edit_initial(panel.proposal)),
        "edit_errors": edit_errors or [],
    }
    return render(opened.request, template, context, status=status)


def _render_panel(
    opened: Opened,
    *,
    shown_digest: str = "",
    notice: Notice | None = None,
    reject_form: ReasonForm | None = None,
    revoke_form: ReasonForm | None = None,
) -> HttpResponse:
    """The decision panel with the page parts it changes (badge, history, edit section)."""
    panel = _panel(opened, shown_digest)
    context = {
        **panel.context(),
        "notice": notice,
        "reject_form": reject_form,
        "revoke_form": revoke_form,
    }
    invalid = any(form is not None and form.errors for form in (reject_form, revoke_form))
    return render(
        opened.request, f"{REVIEW_TEMPLATE}#panel-response", context, status=422 if invalid else 200
    )


def _review_url(occurrence_id: Any, **query: str) -> str:
    url = reverse("approvals:review", args=[occurrence_id])
    return f"{url}?{urlencode(query)}" if query else url


@require_GET
@console_login_required
def review(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    opened = _open(request, occurrence_id)
    notices = [
        Notice(m.level_tag or "info", escape(m.message)) for m in messages.get_messages(request)
    ]
    return _render_review(
        opened,
        since_digest=request.GET.get("since", ""),
        notice=notices[-1] if notices else None,
    )


@require_GET
@console_login_required
def panel(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    """The decision panel alone; the page polls it while the state can still change.

    The stamp comes first, from one query: a poll that finds nothing new ends there."""
    access = console_access(request.user)
    fresh = freshness_get(occurrence_id=occurrence_id, tenant_ids=access.tenant_ids)
    if fresh is None:
        raise Http404("No such request in your tenants.")
    shown = request.GET.get("shown", "")
    viewer = _viewer(request, access, fresh.tenant_id)
    current_stamp = presenters.panel_stamp(fresh, viewer, shown_digest=shown, now=timezone.now())
    if request.GET.get("rendered") == current_stamp:
        return HttpResponse(status=204)
    current = _panel(_open(request, occurrence_id, access=access), shown)
    context = {**current.context(), "notice": None}
    return render(request, f"{REVIEW_TEMPLATE}#panel-response", context)


# --- decisions -------------------------------------------------------------------------

_LEVELS = {
    "success": messages.SUCCESS,
    "info": messages.INFO,
    "warning": messages.WARNING,
    "error": messages.ERROR,
}


def _decided(
    request: HtmxHttpRequest, opened: Opened, notice: Notice, shown_digest: str = ""
) -> HttpResponse:
    """After a decision, won or lost: the panel for htmx, otherwise back to the page."""
    if request.htmx:
        return _render_panel(opened.reload(), notice=notice, shown_digest=shown_digest)
    messages.add_message(request, _LEVELS[notice.level], notice.text)
    return redirect(_review_url(opened.occurrence.pk))


def _stale(request: HtmxHttpRequest, opened: Opened, seen: str) -> HttpResponse:
    """The action changed under the reviewer: show the new version and what changed."""
    opened = opened.reload()
    current = current_proposal(opened.occurrence)
    notice = Notice(
        "warning",
        f"The action changed after you opened it: version {current.version} replaces the "
        "version you saw, so nothing was recorded. Review the changes below before deciding.",
    )
    if request.htmx:
        response = _render_review(
            opened, template=f"{REVIEW_TEMPLATE}#review-body", since_digest=seen, notice=notice
        )
        return reswap(retarget(response, "#review"), "outerHTML")
    messages.warning(request, notice.text)
    return redirect(_review_url(opened.occurrence.pk, since=seen))


@require_POST
@console_login_required
def approve(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    opened = _open(request, occurrence_id, role=Membership.Role.REVIEWER)
    form = ApproveForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("Send the digest of the version you reviewed.")
    seen = form.cleaned_data["action_digest"]
    try:
        outcome = occurrence_approve(
            occurrence=opened.occurrence, reviewer=request.user, seen_digest=seen
        )
    except ServiceError as exc:
        if exc.code == "stale_digest":
            return _stale(request, opened, seen)
        if exc.code == "forbidden":
            raise PermissionDenied(exc.message) from exc
        return _decided(request, opened, refusal(exc.code, exc.message), shown_digest=seen)
    if outcome.issued:
        notice = Notice("success", "Approved. The approval is issued to the runtime.")
    else:
        notice = Notice(
            "success",
            f"Your approval is recorded: {outcome.votes} of {outcome.needed}. "
            "Another reviewer must approve too.",
        )
    return _decided(request, opened, notice)


@require_POST
@console_login_required
def reject(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    opened = _open(request, occurrence_id, role=Membership.Role.REVIEWER)
    form = ReasonForm(request.POST)
    if form.is_valid():
        try:
            occurrence_reject(
                occurrence=opened.occurrence,
                reviewer=request.user,
                reason=form.cleaned_data["reason"],
            )
        except InputError as exc:
            form.add_error("reason", exc.message)
        except ServiceError as exc:
            if exc.code == "forbidden":
                raise PermissionDenied(exc.message) from exc
            return _decided(request, opened, refusal(exc.code, exc.message))
        else:
            notice = Notice("success", "You rejected this request. The agent gets your reason.")
            return _decided(request, opened, notice)
    if request.htmx:
        return _render_panel(opened, reject_form=form)
    return _render_review(opened, reject_form=form, status=422)


@require_POST
@console_login_required
def revoke(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    opened = _open(request, occurrence_id, role=Membership.Role.ADMIN)
    form = ReasonForm(request.POST)
    if not form.is_valid():
        if request.htmx:
            return _render_panel(opened, revoke_form=form)
        return _render_review(opened, revoke_form=form, status=422)
    decision = occurrence_decision(opened.occurrence)
    revoked = False
    if decision.approval is not None and decision.state in {
        PanelState.ISSUED,
        PanelState.DELIVERED,
    }:
        try:
            revoked = approval_revoke(
                approval=decision.approval, admin=request.user, reason=form.cleaned_data["reason"]
            )
        except ServiceError as exc:
            raise PermissionDenied(exc.message) from exc
    if revoked:
        notice = Notice("success", "You revoked this approval.")
    else:
        notice = Notice("error", "There is no issued approval to revoke any more.")
    return _decided(request, opened, notice)


@require_POST
@console_login_required
def edit(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    """Save edited arguments as a new version. A plain form: the whole page changes."""
    opened = _open(request, occurrence_id, role=Membership.Role.REVIEWER)
    form = EditForm(request.POST)
    if not form.is_valid():
        errors = [str(e) for field_errors in form.errors.values() for e in field_errors]
        return _render_review(opened, edit_form=form, edit_errors=errors, status=422)
    seen = form.cleaned_data["action_digest"]
    try:
        arguments = parse_json(form.cleaned_data["arguments"].encode("utf-8"))
        proposal = proposal_edit(
            occurrence=opened.occurrence, editor=request.user, arguments=arguments, seen_digest=seen
        )
    except InputError as exc:
        errors = presenters.input_errors(exc.details, exc.field, exc.message)
        return _render_review(opened, edit_form=form, edit_errors=errors, status=422)
    except ServiceError as exc:
        if exc.code == "forbidden":
            raise PermissionDenied(exc.message) from exc
        opened = opened.reload()
        if exc.code != "stale_digest":
            # The edit section is gone once the request is decided: say it in the panel.
            notice = refusal(exc.code, exc.message)
            return _render_review(opened, edit_form=form, notice=notice, status=409)
        current = current_proposal(opened.occurrence)
        errors = [
            f"The action changed while you were editing it: version {current.version} is now "
            "current. Your text is kept below; check it against the new version before saving "
            "again."
        ]
        # Keep the reviewer's text, bound now to the version they have been shown.
        kept = EditForm(
            initial={
                "arguments": form.cleaned_data["arguments"],
                "action_digest": current.action_digest,
            }
        )
        return _render_review(
            opened, since_digest=seen, edit_form=kept, edit_errors=errors, status=409
        )
    messages.success(
        request,
        f"Saved as version {proposal.version}. Approvals of earlier versions no longer count; "
        "this version needs its own review.",
    )
    return redirect(_review_url(occurrence_id))
