"""The review page (``/reviews/<id>/``) and its decision panel: the exact canonical action
and its digest, and the decisions (approve, reject, edit, revoke), each re-rendered from
the database whether it won or lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import reswap, retarget

from approvals.canonical.parsing import parse_json
from approvals.errors import ErrorCode, InputError, ServiceError
from approvals.models import Membership, Occurrence
from approvals.notifications.selectors import notifications_read
from approvals.reviews.decisions import occurrence_approve, occurrence_reject, proposal_edit
from approvals.reviews.revocation import approval_revoke
from approvals.vocabulary import PanelState
from approvals.web.forms import (
    ApproveForm,
    EditForm,
    ReasonForm,
)
from approvals.web.presenters.review import (
    DecisionPanel,
    Viewer,
    decision_panel,
    edit_initial,
    panel_stamp,
    review_page,
)
from approvals.web.presenters.routing import routed_by
from approvals.web.selectors.access import ConsoleAccess, console_access
from approvals.web.selectors.history import HistoryCursor
from approvals.web.selectors.review import (
    Reviewed,
    freshness_get,
    occurrence_decision,
    review_get,
    review_snapshot,
)
from approvals.web.shell import (
    HtmxHttpRequest,
    Notice,
    chrome,
    console_login_required,
    input_errors,
    refusal,
)

REVIEW_TEMPLATE = "approvals/review.html"


_REQUIRED: dict[str, str] = {
    Membership.Role.REVIEWER: "Only reviewers of this tenant can decide or edit requests.",
    Membership.Role.ADMIN: "Only admins of this tenant can revoke approvals.",
}


def _viewer(request: HttpRequest, access: ConsoleAccess, tenant_id: int) -> Viewer:
    return Viewer(
        username=request.user.get_username(),
        is_reviewer=access.is_reviewer(tenant_id),
        is_admin=access.is_admin(tenant_id),
    )


@dataclass(frozen=True)
class Opened:
    """An occurrence the signed-in user may see, with their roles in its tenant."""

    request: HttpRequest
    access: ConsoleAccess
    reviewed: Reviewed

    @property
    def occurrence(self) -> Occurrence:
        return self.reviewed.occurrence

    @property
    def viewer(self) -> Viewer:
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
    reviewed = review_get(occurrence_id=occurrence_id, tenant_ids=access.tenant_ids)
    if reviewed is None:
        raise Http404("No such request in your tenants.")
    occurrence = reviewed.occurrence
    if role == Membership.Role.REVIEWER and not access.is_reviewer(occurrence.tenant_id):
        raise PermissionDenied(_REQUIRED[role])
    if role == Membership.Role.ADMIN and not access.is_admin(occurrence.tenant_id):
        raise PermissionDenied(_REQUIRED[role])
    return Opened(request, access, reviewed)


def _panel(opened: Opened, shown_digest: str = "") -> DecisionPanel:
    # The window of the history the page (or its poll) asks for with ?before= or ?after=;
    # the answer to a decision, posted without either, shows the newest events.
    query = opened.request.GET
    cursor = HistoryCursor.parse(query.get("before"), query.get("after"))
    snapshot = review_snapshot(opened.reviewed, cursor=cursor)
    return decision_panel(snapshot, opened.viewer, shown_digest=shown_digest)


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
        **chrome(opened.request, opened.access),
        **panel.context(),
        **review_page(panel, since_digest=since_digest),
        "notice": notice,
        "reject_form": reject_form,
        "revoke_form": revoke_form,
        "edit_form": edit_form or EditForm(initial=edit_initial(panel.proposal)),
        "edit_errors": edit_errors or [],
        "routed_by": routed_by(panel.occurrence.routed_by_id),
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
    # Opened: what the console told the reader of this request is read now, and the
    # header (its count read with the roles, before) counts it no more.
    opened.access.notifications_read(
        notifications_read(user_id=request.user.pk, occurrence_id=opened.occurrence.pk)
    )
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
    current_stamp = panel_stamp(fresh, viewer, shown_digest=shown, now=timezone.now())
    if request.GET.get("rendered") == current_stamp:
        return HttpResponse(status=204)
    current = _panel(_open(request, occurrence_id, access=access), shown)
    context = {**current.context(), "notice": None}
    return render(request, f"{REVIEW_TEMPLATE}#panel-response", context)


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
    current = opened.reviewed.current_proposal
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
        if exc.code == ErrorCode.STALE_DIGEST:
            return _stale(request, opened, seen)
        if exc.code == ErrorCode.FORBIDDEN:
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
            if exc.code == ErrorCode.FORBIDDEN:
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
    decision = occurrence_decision(opened.reviewed)
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
    if (
        opened.occurrence.status == Occurrence.Status.APPROVED
        and not form.cleaned_data["withdraw_approval"]
    ):
        # The service lets an edit supersede an unclaimed approval; a reviewer does so only
        # from the form that says it (approved since this page was opened: not that one).
        errors = [
            "This request was approved since you opened the page: saving would withdraw "
            "that approval. Nothing was saved. Your text is kept below, in the form that "
            "withdraws the approval; save there if that is what you mean."
        ]
        return _render_review(opened, edit_form=form, edit_errors=errors, status=409)
    try:
        arguments = parse_json(form.cleaned_data["arguments"].encode("utf-8"))
        proposal = proposal_edit(
            occurrence=opened.occurrence, editor=request.user, arguments=arguments, seen_digest=seen
        )
    except InputError as exc:
        errors = input_errors(exc.details, exc.field, exc.message)
        return _render_review(opened, edit_form=form, edit_errors=errors, status=422)
    except ServiceError as exc:
        if exc.code == ErrorCode.FORBIDDEN:
            raise PermissionDenied(exc.message) from exc
        opened = opened.reload()
        if exc.code != ErrorCode.STALE_DIGEST:
            # The edit section is gone once the request is decided: say it in the panel.
            notice = refusal(exc.code, exc.message)
            return _render_review(opened, edit_form=form, notice=notice, status=409)
        current = opened.reviewed.current_proposal
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
