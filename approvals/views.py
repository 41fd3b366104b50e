"""The reviewer console: server-rendered pages whose htmx fragments come from the same
templates. Views check access through one helper, call one service and re-render from the
database, whether the action won or lost."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
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
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget
from django_htmx.middleware import HtmxDetails

from approvals import selectors, services
from approvals.canonical import InputError, parse_json, pretty
from approvals.forms import (
    STATE_ALL,
    STATE_CHOICES,
    ApproveForm,
    EditForm,
    InboxFilterForm,
    ReasonForm,
    TenantSwitchForm,
)
from approvals.models import AuditEvent, Membership, Occurrence, Proposal, Tenant, ToolContract
from approvals.selectors import DecisionView, PanelState

SESSION_TENANT = "console_tenant"
INBOX_PAGE_SIZE = 25
PANEL_POLL_SECONDS = 2
INBOX_POLL_SECONDS = 5


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


class Access:
    """The signed-in user's console roles, read once per request."""

    def __init__(self, memberships: list[Membership]) -> None:
        self.roles: dict[int, set[str]] = {}
        self.tenants: list[Tenant] = []
        for membership in memberships:
            if membership.tenant_id not in self.roles:
                self.roles[membership.tenant_id] = set()
                self.tenants.append(membership.tenant)
            self.roles[membership.tenant_id].add(membership.role)

    @property
    def tenant_ids(self) -> list[int]:
        return list(self.roles)

    def is_reviewer(self, tenant_id: int) -> bool:
        return Membership.Role.REVIEWER in self.roles.get(tenant_id, set())

    def is_admin(self, tenant_id: int) -> bool:
        return Membership.Role.ADMIN in self.roles.get(tenant_id, set())


def _access(request: HttpRequest) -> Access:
    return Access(selectors.console_memberships(request.user))


def _scope(request: HttpRequest, access: Access) -> Tenant | None:
    """The tenant chosen in the header, or None for all of the user's tenants."""
    slug = request.session.get(SESSION_TENANT)
    return next((t for t in access.tenants if t.slug == slug), None)


def _chrome(request: HttpRequest, access: Access) -> dict[str, Any]:
    """What the header needs: the tenant switcher."""
    return {"tenants": access.tenants, "current_tenant": _scope(request, access)}


def _occurrence_for(access: Access, occurrence_id: Any) -> Occurrence:
    """The occurrence if the user may see it. Another tenant's looks like no occurrence."""
    occurrence = selectors.review_get(occurrence_id=occurrence_id, tenant_ids=access.tenant_ids)
    if occurrence is None:
        raise Http404("No such request in your tenants.")
    return occurrence


def _require_reviewer(access: Access, occurrence: Occurrence) -> None:
    if not access.is_reviewer(occurrence.tenant_id):
        raise PermissionDenied("Only reviewers of this tenant can decide or edit requests.")


def _require_admin(access: Access, occurrence: Occurrence) -> None:
    if not access.is_admin(occurrence.tenant_id):
        raise PermissionDenied("Only admins of this tenant can revoke approvals.")


# --- showing agent-supplied text ------------------------------------------------------

# Characters that render as nothing, as a space, or that reorder the text around them
# (bidi controls): a reviewer could not see them, so they are shown as JSON escapes.
_HIDDEN_CATEGORIES = {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"}


def _is_hidden(char: str) -> bool:
    if char in "\n\t":
        return False
    category = unicodedata.category(char)
    return category in _HIDDEN_CATEGORIES or (category == "Zs" and char != " ")


def _json_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _reveal(text: str) -> tuple[SafeString, int]:
    """Escaped HTML of ``text`` with hidden characters shown as highlighted ``\\uXXXX``.

    In JSON, every non-ASCII character sits inside a string, where ``\\uXXXX`` denotes the
    same character: the revealed text still parses to the exact digested value.
    """
    pieces: list[tuple[str, str]] = []
    hidden = 0
    run = ""
    for char in text:
        if _is_hidden(char):
            if run:
                pieces.append(("{}", run))
                run = ""
            hidden += 1
            pieces.append(
                (
                    '<mark class="hidden-char" title="Invisible character U+{}">{}</mark>',
                    f"{ord(char):04X}\0{_json_escape(char)}",
                )
            )
        else:
            run += char
    if run:
        pieces.append(("{}", run))
    html = format_html_join("", "{}", ((_piece(fmt, value),) for fmt, value in pieces))
    return html, hidden


def _piece(fmt: str, value: str) -> SafeString:
    if "\0" in value:
        codepoint, escape = value.split("\0", 1)
        return format_html(fmt, codepoint, escape)
    return format_html(fmt, value)


def _plain_reveal(text: str) -> str:
    """``text`` with hidden characters as ``\\uXXXX``, for a textarea."""
    return "".join(_json_escape(c) if _is_hidden(c) and ord(c) > 0x7F else c for c in text)


def _json_value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _arguments(proposal: Proposal) -> dict[str, Any]:
    arguments = json.loads(proposal.canonical_action).get("arguments", {})
    return arguments if isinstance(arguments, dict) else {}


def _summary(proposal: Proposal | None, limit: int = 110) -> SafeString:
    if proposal is None:
        return SafeString("")
    text = ", ".join(f"{k}={_json_value(v)}" for k, v in _arguments(proposal).items())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return _reveal(text)[0]


# --- labels ----------------------------------------------------------------------------

PANEL_LABELS = {
    PanelState.PENDING: "Pending review",
    PanelState.AWAITING_QUORUM: "Awaiting quorum",
    PanelState.ISSUED: "Approved",
    PanelState.DELIVERED: "Token delivered",
    PanelState.CONSUMED: "Consumed",
    PanelState.REJECTED: "Rejected",
    PanelState.REVOKED: "Revoked",
    PanelState.EXPIRED: "Expired",
    PanelState.AUTO_ADMITTED: "Auto-admitted",
}

REPLAY_SAFETY_HELP = {
    ToolContract.ReplaySafety.READ_ONLY: "changes nothing; may be repeated",
    ToolContract.ReplaySafety.IDEMPOTENT_WITH_KEY: "a repeat with the same key has no new effect",
    ToolContract.ReplaySafety.EFFECT_QUERYABLE: "its effect can be looked up before a retry",
    ToolContract.ReplaySafety.UNSAFE: "never repeated without an explicit decision",
}

# Refusals a reviewer can meet, said in the console's words.
REFUSALS = {
    "not_pending": "Another decision was recorded first; this is the current state.",
    "self_approval": "You requested this action, so another reviewer must approve it.",
    "not_editable": "This request can no longer be edited: it is no longer pending or unclaimed.",
}


@dataclass(frozen=True)
class Notice:
    level: str  # success, info, warning, error
    text: str


def _inbox_state(occurrence: Occurrence, now: datetime) -> tuple[str, str]:
    """An inbox row's badge: the occurrence's status, refined by its approval."""
    status = occurrence.status
    approvals = getattr(occurrence, "current_approvals", [])
    if status == Occurrence.Status.APPROVED and approvals:
        approval = approvals[0]
        if selectors.approval_state(approval, now) == "expired":
            return "expired", "Expired"
        if approval.delivered_at:
            return "delivered", "Token delivered"
    badge = "pending" if status == Occurrence.Status.PENDING_REVIEW else status
    return badge, Occurrence.Status(status).label


def _age(then: datetime, now: datetime) -> str:
    if (now - then).total_seconds() < 60:
        return "just now"
    return timesince(then, now).split(",")[0] + " ago"


# --- inbox -----------------------------------------------------------------------------


@require_GET
@console_login_required
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    access = _access(request)
    scope = _scope(request, access)
    tenant_ids = [scope.pk] if scope else access.tenant_ids
    form = InboxFilterForm(request.GET, tools=selectors.tool_names())
    tool, state = form.filters()
    occurrences = selectors.inbox_occurrences(
        tenant_ids=tenant_ids, tool=tool, status="" if state == STATE_ALL else state
    )
    page = Paginator(occurrences, INBOX_PAGE_SIZE).get_page(request.GET.get("page"))
    now = timezone.now()
    rows = []
    for occurrence in page.object_list:
        proposals = getattr(occurrence, "current_proposals", [])
        badge, label = _inbox_state(occurrence, now)
        rows.append(
            {
                "occurrence": occurrence,
                "summary": _summary(proposals[0] if proposals else None),
                "requested_by": _reveal(occurrence.requested_by)[0],
                "run_id": _reveal(occurrence.run_id)[0],
                "badge": badge,
                "label": label,
                "age": _age(occurrence.created_at, now),
            }
        )
    filters = {"tool": tool, "state": state}
    stamp = _stamp(
        [filters, page.number, page.paginator.count]
        + [(r["occurrence"].pk, r["badge"], r["age"]) for r in rows]
    )
    if request.htmx and request.GET.get("rendered") == stamp:
        return HttpResponse(status=204)
    state_label = dict(STATE_CHOICES)[state]
    poll_query = urlencode({**filters, "page": page.number, "rendered": stamp})
    context = {
        **_chrome(request, access),
        "form": form,
        "tool": tool,
        "state": state,
        "state_label": state_label,
        "state_choices": STATE_CHOICES,
        "tool_choices": form.tool_choices,
        "page": page,
        "rows": rows,
        "show_tenant": scope is None and len(access.tenants) > 1,
        "has_access": bool(access.tenants),
        "query": urlencode(filters),
        "poll_url": f"{reverse('approvals:inbox')}?{poll_query}",
        "poll_seconds": INBOX_POLL_SECONDS,
        "announce": f"{page.paginator.count} {state_label.lower()}",
    }
    if request.htmx and not request.htmx.history_restore_request:
        return render(request, "approvals/inbox.html#inbox-list", context)
    return render(request, "approvals/inbox.html", context)


@require_POST
@console_login_required
def switch_tenant(request: HtmxHttpRequest) -> HttpResponse:
    access = _access(request)
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


def _stamp(parts: Any) -> str:
    """A short name for what a polled fragment shows; equal names mean nothing changed."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _panel_context(
    request: HttpRequest,
    access: Access,
    occurrence: Occurrence,
    *,
    shown_digest: str = "",
    notice: Notice | None = None,
    reject_form: ReasonForm | None = None,
    revoke_form: ReasonForm | None = None,
) -> dict[str, Any]:
    """Everything the decision panel shows; also what the review page shares with it."""
    now = timezone.now()
    decision: DecisionView = selectors.occurrence_decision(occurrence, now)
    proposal = decision.proposal
    proposals = list(occurrence.proposals.all())
    # The digest the page on screen displays: the approve form sends it, never a newer one.
    shown = next((p for p in proposals if p.action_digest == shown_digest), proposal)
    username = request.user.get_username()
    is_reviewer = access.is_reviewer(occurrence.tenant_id)
    undecided = decision.state in {PanelState.PENDING, PanelState.AWAITING_QUORUM}
    approval = decision.approval
    history = selectors.occurrence_history(occurrence)

    eligible: list[str] = []
    if undecided:
        eligible = [
            name
            for name in selectors.tenant_reviewer_names(occurrence.tenant_id)
            if name not in decision.voters and name != occurrence.requested_by
        ]
    rejected_by = next((e.actor for e in reversed(history) if e.kind == "occurrence.rejected"), "")
    expires_in = ""
    if approval is not None and decision.state in {PanelState.ISSUED, PanelState.DELIVERED}:
        expires_in = timesince(now, approval.expires_at).split(",")[0]

    context: dict[str, Any] = {
        "editable": is_reviewer
        and occurrence.status in {Occurrence.Status.PENDING_REVIEW, Occurrence.Status.APPROVED}
        and decision.state != PanelState.CONSUMED,
        "occurrence": occurrence,
        "decision": decision,
        "proposal": proposal,
        "approval": approval,
        "command": decision.command,
        "state_label": PANEL_LABELS[decision.state],
        "shown": shown,
        "shown_is_current": shown.pk == proposal.pk,
        "is_reviewer": is_reviewer,
        "is_admin": access.is_admin(occurrence.tenant_id),
        "is_requester": bool(occurrence.requested_by) and occurrence.requested_by == username,
        "has_voted": username in decision.voters,
        "undecided": undecided,
        "can_decide": is_reviewer and undecided,
        "can_revoke": access.is_admin(occurrence.tenant_id)
        and decision.state in {PanelState.ISSUED, PanelState.DELIVERED},
        "still_needed": max(decision.needed - len(decision.votes), 0),
        "eligible": eligible,
        "rejected_by": rejected_by,
        "expires_in": expires_in,
        "history": history,
        "notice": notice,
        "reject_form": reject_form,
        "revoke_form": revoke_form,
        "rejection_reason": _reveal(occurrence.rejection_reason)[0],
        "now": now,
    }
    stamp = _stamp(
        [
            decision.state,
            proposal.action_digest,
            shown.action_digest,
            decision.voters,
            decision.needed,
            None
            if approval is None
            else (
                approval.state,
                approval.delivered_at,
                approval.consumed_at,
                approval.revoked_at,
                approval.fingerprint,
            ),
            None if decision.command is None else (decision.command.pk, decision.command.state),
            expires_in,
            eligible,
            len(history),
            context["can_decide"],
            context["can_revoke"],
            context["editable"],
        ]
    )
    context["stamp"] = stamp
    if not decision.final:
        query = urlencode({"shown": shown.action_digest, "rendered": stamp})
        context["poll_url"] = f"{reverse('approvals:panel', args=[occurrence.pk])}?{query}"
        context["poll_seconds"] = PANEL_POLL_SECONDS
    return context


def _diff_rows(old: Proposal, new: Proposal) -> list[dict[str, Any]]:
    before, after = _arguments(old), _arguments(new)
    rows = []
    for key in sorted(set(before) | set(after)):
        old_text = _json_value(before[key]) if key in before else ""
        new_text = _json_value(after[key]) if key in after else ""
        if key in before and key in after and old_text == new_text:
            continue
        change = "added" if key not in before else "removed" if key not in after else "changed"
        rows.append(
            {
                "key": _reveal(key)[0],
                "old": _reveal(old_text)[0],
                "new": _reveal(new_text)[0],
                "change": change,
            }
        )
    return rows


def _quorum_rule(tool: ToolContract) -> str:
    if tool.quorum_amount_argument and tool.quorum_threshold_minor is not None:
        return (
            f"{tool.approvals_required} distinct reviewers when {tool.quorum_amount_argument} "
            f"is above {tool.quorum_threshold_minor}; otherwise 1"
        )
    if tool.approvals_required == 1:
        return "1 reviewer"
    return f"{tool.approvals_required} distinct reviewers"


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} minute{'' if minutes == 1 else 's'}"
    return f"{minutes // 60} hours" + (f" {minutes % 60} minutes" if minutes % 60 else "")


_HISTORY_DETAIL_KEYS = [
    "version",
    "from_version",
    "to_version",
    "votes",
    "needed",
    "approvers",
    "expires_at",
    "epoch",
    "idempotency_key",
    "justification",
    "reason",
]


def _detail_value(value: Any) -> str:
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
        if moment.tzinfo is not None:
            return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")
        return value
    return str(value)


def _history_rows(events: list[AuditEvent]) -> list[dict[str, Any]]:
    rows = []
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        details = [
            (key.replace("_", " "), _detail_value(data[key]))
            for key in _HISTORY_DETAIL_KEYS
            if key in data
        ]
        if event.execution_id:
            details.append(("execution", event.execution_id))
        if event.command_id:
            details.append(("command", str(event.command_id)))
        rows.append({"event": event, "details": details})
    return rows


def _review_context(
    request: HttpRequest,
    access: Access,
    occurrence: Occurrence,
    *,
    since_digest: str = "",
    edit_form: EditForm | None = None,
    edit_errors: list[str] | None = None,
    **panel: Any,
) -> dict[str, Any]:
    context = _panel_context(request, access, occurrence, **panel)
    proposal: Proposal = context["proposal"]
    proposals = list(occurrence.proposals.all())
    action_html, hidden = _reveal(pretty(proposal.canonical_action))

    # The version the diff starts from: the one the reviewer saw before, else the previous.
    base = next(
        (p for p in proposals if p.action_digest == since_digest and p.pk != proposal.pk), None
    )
    if base is None and proposal.version > 1:
        base = next((p for p in proposals if p.version == proposal.version - 1), None)

    if edit_form is None:
        arguments = json.dumps(_arguments(proposal), indent=2, ensure_ascii=False)
        edit_form = EditForm(
            initial={"arguments": _plain_reveal(arguments), "action_digest": proposal.action_digest}
        )
    tool = occurrence.tool
    context.update(
        _chrome(request, access),
        tool=tool,
        tenant=occurrence.tenant,
        versions=len(proposals),
        action_html=action_html,
        hidden_chars=hidden,
        reason_html=_reveal(occurrence.reason)[0],
        requested_by_html=_reveal(occurrence.requested_by)[0],
        run_id_html=_reveal(occurrence.run_id)[0],
        diff_base=base,
        diff_rows=_diff_rows(base, proposal) if base else [],
        since_mode=base is not None and base.action_digest == since_digest,
        edit_form=edit_form,
        edit_errors=edit_errors or [],
        next_version=proposal.version + 1,
        replay_help=REPLAY_SAFETY_HELP.get(ToolContract.ReplaySafety(tool.replay_safety), ""),
        quorum_rule=_quorum_rule(tool),
        lifetime=_duration(tool.approval_lifetime.total_seconds()),
        history_rows=_history_rows(context["history"]),
    )
    return context


def _panel_response(
    request: HttpRequest, access: Access, occurrence_id: Any, **panel: Any
) -> HttpResponse:
    """The decision panel re-read from the database, with the page parts it changes."""
    occurrence = _occurrence_for(access, occurrence_id)
    context = _panel_context(request, access, occurrence, **panel)
    context["history_rows"] = _history_rows(context["history"])
    status = 422 if _has_errors(panel) else 200
    return render(request, "approvals/review.html#panel-response", context, status=status)


def _has_errors(panel: dict[str, Any]) -> bool:
    return any(
        form is not None and form.errors
        for form in (panel.get("reject_form"), panel.get("revoke_form"))
    )


def _review_url(occurrence_id: Any, **query: str) -> str:
    url = reverse("approvals:review", args=[occurrence_id])
    return f"{url}?{urlencode(query)}" if query else url


@require_GET
@console_login_required
def review(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    access = _access(request)
    occurrence = _occurrence_for(access, occurrence_id)
    notices = [Notice(m.level_tag or "info", str(m)) for m in messages.get_messages(request)]
    context = _review_context(
        request,
        access,
        occurrence,
        since_digest=request.GET.get("since", ""),
        notice=notices[-1] if notices else None,
    )
    return render(request, "approvals/review.html", context)


@require_GET
@console_login_required
def panel(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    """The decision panel alone; the page polls it while the state can still change."""
    access = _access(request)
    occurrence = _occurrence_for(access, occurrence_id)
    context = _panel_context(request, access, occurrence, shown_digest=request.GET.get("shown", ""))
    if request.GET.get("rendered") == context["stamp"]:
        return HttpResponse(status=204)
    context["history_rows"] = _history_rows(context["history"])
    return render(request, "approvals/review.html#panel-response", context)


# --- decisions -------------------------------------------------------------------------


def _decided(
    request: HtmxHttpRequest,
    access: Access,
    occurrence_id: Any,
    notice: Notice,
    shown_digest: str = "",
) -> HttpResponse:
    """After a decision, won or lost: the panel for htmx, otherwise back to the page."""
    if request.htmx:
        return _panel_response(
            request, access, occurrence_id, notice=notice, shown_digest=shown_digest
        )
    messages.add_message(request, _LEVELS[notice.level], notice.text)
    return redirect(_review_url(occurrence_id))


_LEVELS = {
    "success": messages.SUCCESS,
    "info": messages.INFO,
    "warning": messages.WARNING,
    "error": messages.ERROR,
}


def _stale(request: HtmxHttpRequest, access: Access, occurrence_id: Any, seen: str) -> HttpResponse:
    """The action changed under the reviewer: show the new version and what changed."""
    occurrence = _occurrence_for(access, occurrence_id)
    current = selectors.current_proposal(occurrence)
    notice = Notice(
        "warning",
        f"The action changed after you opened it: version {current.version} replaces the "
        "version you saw, so nothing was recorded. Review the changes below before deciding.",
    )
    if request.htmx:
        context = _review_context(request, access, occurrence, since_digest=seen, notice=notice)
        response = render(request, "approvals/review.html#review-body", context)
        return reswap(retarget(response, "#review"), "outerHTML")
    messages.warning(request, notice.text)
    return redirect(_review_url(occurrence_id, since=seen))


@require_POST
@console_login_required
def approve(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    access = _access(request)
    occurrence = _occurrence_for(access, occurrence_id)
    _require_reviewer(access, occurrence)
    form = ApproveForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("Send the digest of the version you reviewed.")
    seen = form.cleaned_data["action_digest"]
    try:
        outcome = services.occurrence_approve(
            occurrence=occurrence, reviewer=request.user, seen_digest=seen
        )
    except services.ServiceError as exc:
        if exc.code == "stale_digest":
            return _stale(request, access, occurrence_id, seen)
        if exc.code == "forbidden":
            raise PermissionDenied(exc.message) from exc
        notice = Notice("error", REFUSALS.get(exc.code, exc.message))
        return _decided(request, access, occurrence_id, notice, shown_digest=seen)
    if outcome.issued:
        notice = Notice("success", "Approved. The approval is issued to the runtime.")
    else:
        notice = Notice(
            "success",
            f"Your approval is recorded: {outcome.votes} of {outcome.needed}. "
            "Another reviewer must approve too.",
        )
    return _decided(request, access, occurrence_id, notice)


@require_POST
@console_login_required
def reject(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    access = _access(request)
    occurrence = _occurrence_for(access, occurrence_id)
    _require_reviewer(access, occurrence)
    form = ReasonForm(request.POST)
    if form.is_valid():
        try:
            services.occurrence_reject(
                occurrence=occurrence, reviewer=request.user, reason=form.cleaned_data["reason"]
            )
        except InputError as exc:
            form.add_error("reason", exc.message)
        except services.ServiceError as exc:
            if exc.code == "forbidden":
                raise PermissionDenied(exc.message) from exc
            return _decided(
                request, access, occurrence_id, Notice("error", REFUSALS.get(exc.code, exc.message))
            )
        else:
            notice = Notice("success", "You rejected this request. The agent gets your reason.")
            return _decided(request, access, occurrence_id, notice)
    if request.htmx:
        return _panel_response(request, access, occurrence_id, reject_form=form)
    context = _review_context(request, access, occurrence, reject_form=form)
    return render(request, "approvals/review.html", context, status=422)


@require_POST
@console_login_required
def revoke(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    access = _access(request)
    occurrence = _occurrence_for(access, occurrence_id)
    _require_admin(access, occurrence)
    form = ReasonForm(request.POST)
    if not form.is_valid():
        if request.htmx:
            return _panel_response(request, access, occurrence_id, revoke_form=form)
        context = _review_context(request, access, occurrence, revoke_form=form)
        return render(request, "approvals/review.html", context, status=422)
    decision = selectors.occurrence_decision(occurrence)
    revoked = False
    if decision.approval is not None and decision.state in {
        PanelState.ISSUED,
        PanelState.DELIVERED,
    }:
        try:
            revoked = services.approval_revoke(
                approval=decision.approval, admin=request.user, reason=form.cleaned_data["reason"]
            )
        except services.ServiceError as exc:
            raise PermissionDenied(exc.message) from exc
    if revoked:
        notice = Notice("success", "You revoked this approval.")
    else:
        notice = Notice("error", "There is no issued approval to revoke any more.")
    return _decided(request, access, occurrence_id, notice)


@require_POST
@console_login_required
def edit(request: HtmxHttpRequest, occurrence_id: Any) -> HttpResponse:
    """Save edited arguments as a new version. A plain form: the whole page changes."""
    access = _access(request)
    occurrence = _occurrence_for(access, occurrence_id)
    _require_reviewer(access, occurrence)
    form = EditForm(request.POST)
    errors: list[str] = []
    notice: Notice | None = None
    status = 422
    if form.is_valid():
        seen = form.cleaned_data["action_digest"]
        try:
            arguments = parse_json(form.cleaned_data["arguments"].encode("utf-8"))
            proposal = services.proposal_edit(
                occurrence=occurrence, editor=request.user, arguments=arguments, seen_digest=seen
            )
        except InputError as exc:
            errors = _input_errors(exc)
        except services.ServiceError as exc:
            if exc.code == "forbidden":
                raise PermissionDenied(exc.message) from exc
            status = 409
            occurrence = _occurrence_for(access, occurrence_id)
            if exc.code == "stale_digest":
                current = selectors.current_proposal(occurrence)
                errors = [
                    f"The action changed while you were editing it: version {current.version} "
                    "is now current. Your text is kept below; check it against the new version "
                    "before saving again."
                ]
                # Keep the reviewer's text, bound now to the version they have been shown.
                form = EditForm(
                    initial={
                        "arguments": form.cleaned_data["arguments"],
                        "action_digest": current.action_digest,
                    }
                )
                context = _review_context(
                    request,
                    access,
                    occurrence,
                    since_digest=seen,
                    edit_form=form,
                    edit_errors=errors,
                )
                return render(request, "approvals/review.html", context, status=status)
            # The edit section is gone once the request is decided: say it in the panel.
            notice = Notice("error", REFUSALS.get(exc.code, exc.message))
        else:
            messages.success(
                request,
                f"Saved as version {proposal.version}. Approvals of earlier versions no longer "
                "count; this version needs its own review.",
            )
            return redirect(_review_url(occurrence_id))
    else:
        errors = [str(e) for field_errors in form.errors.values() for e in field_errors]
    context = _review_context(
        request, access, occurrence, edit_form=form, edit_errors=errors, notice=notice
    )
    return render(request, "approvals/review.html", context, status=status)


def _input_errors(exc: InputError) -> list[str]:
    if not exc.details:
        return [_field_message(exc.field, exc.message)]
    return [_field_message(d.get("field"), d.get("message", "")) for d in exc.details]


def _field_message(field: str | None, message: str) -> str:
    if field and field.startswith("arguments."):
        return f"{field.removeprefix('arguments.')}: {message}"
    return message
