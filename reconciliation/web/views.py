"""The operators' console: the queue of what needs a person, an occurrence's timeline with
its three evidence dimensions, and the decisions an operator can record. Every decision
is a POST (CSRF) with a required note, refused with the new state shown when the state
no longer allows it. "I'm on it" (take, take over, let go) is a POST too, answered like a
decision: a redirect back to the page it came from."""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import ServiceError
from approvals.models import Command, Tenant
from approvals.reviews.selectors import parse_uuid, tool_ids
from approvals.vocabulary import QUEUE_REASONS, QueueReason
from approvals.web.jinja import render_rows
from approvals.web.selectors.access import console_access
from approvals.web.selectors.history import HistoryCursor
from approvals.web.shell import console_login_required, header
from reconciliation import operator_actions as operations
from reconciliation import takes
from reconciliation.selectors.queue import Owner, queue_counts, queue_items
from reconciliation.selectors.queue_search import SEARCH_MAX, queue_search
from reconciliation.selectors.timeline import timeline_get
from reconciliation.web import presenters

TEMPLATE_QUEUE = "reconciliation/queue.html"
TEMPLATE_TIMELINE = "reconciliation/timeline.html"
QUEUE_POLL_SECONDS = 5


def _operator(request: HttpRequest) -> tuple[list[Tenant], dict[str, Any]]:
    """The user's operator tenants and the header's links and unread count, from one read
    of the roles."""
    access = console_access(request.user)
    if not access.operator_tenants:
        raise PermissionDenied("Only operators of a tenant can open the operations console.")
    return access.operator_tenants, header(access)


@require_GET
@console_login_required
def queue(request: HttpRequest) -> HttpResponse:
    tenants, links = _operator(request)
    tools = tool_ids()
    reason = request.GET.get("reason", "")
    reason = reason if reason in QueueReason.values else ""
    tool = request.GET.get("tool", "")
    tool = tool if tool in tools else ""
    q = request.GET.get("q", "").strip()[:SEARCH_MAX]
    sort = request.GET.get("sort", "")
    sort = sort if sort in presenters.QUEUE_SORTS else "age"
    descending = request.GET.get("dir") == "desc"
    owner_mode = request.GET.get("owner", "")
    owner_mode = owner_mode if owner_mode in (Owner.MINE, Owner.UNOWNED) else ""
    # Signed in (console_login_required): the user has a primary key.
    owner = Owner(owner_mode, cast(int, request.user.pk)) if owner_mode else None
    now = timezone.now()
    tenant_ids = [t.pk for t in tenants]
    # A search names occurrences first; the queue then lists only theirs.
    found = queue_search(q=q, tenant_ids=tenant_ids) if q else None
    counts = queue_counts(
        tenant_ids=tenant_ids, now=now, tool_id=tools.get(tool), occurrence_ids=found, owner=owner
    )
    items = queue_items(
        tenant_ids=tenant_ids,
        now=now,
        reason=reason,
        tool_id=tools.get(tool),
        counts=counts,
        occurrence_ids=found,
        owner=owner,
    )
    total = sum(counts.values())
    matching = counts[reason] if reason else total
    narrowing = (("reason", reason), ("tool", tool), ("owner", owner_mode), ("q", q))
    filters = urlencode([(k, v) for k, v in narrowing if v])
    base = f"{reverse('reconciliation:queue')}?{filters}"
    rows = presenters.queue_sorted(
        presenters.queue_rows(items, now, request.user.pk), sort, descending
    )
    show_tenant = len(tenants) > 1
    direction = "desc" if descending else "asc"
    poll_url = f"{base}{'&' if filters else ''}sort={sort}&dir={direction}"
    context = {
        **links,
        "rows": rows,
        "rows_html": render_rows(
            "reconciliation/queue_rows.html",
            {
                "rows": rows,
                "show_tenant": show_tenant,
                # The rows' "I'm on it" forms: their token, and where their answer leads.
                "csrf_token": get_token(request),
                "back": poll_url,
            },
        ),
        "counts": [(r, r.label, counts[r]) for r in QUEUE_REASONS],
        "total": total,
        # The queue lists the oldest QUEUE_LIMIT; the rest wait their turn (or a filter).
        "unlisted": max(matching - len(items), 0),
        "reason": reason,
        "tool": tool,
        "q": q,
        "owner": owner_mode,
        "owner_choices": Owner.CHOICES,
        "count_query": urlencode(
            [(k, v) for k, v in (("tool", tool), ("owner", owner_mode), ("q", q)) if v]
        ),
        "sorts": presenters.queue_sort_links(base, sort, descending),
        "reason_choices": presenters.REASON_CHOICES,
        "tool_choices": [("", "All tools"), *((name, name) for name in tools)],
        "show_tenant": show_tenant,
        "poll_url": poll_url,
        "poll_seconds": QUEUE_POLL_SECONDS,
        "announce": f"{total} item{'s' if total != 1 else ''} need a person",
    }
    if getattr(request, "htmx", False) and not request.htmx.history_restore_request:  # type: ignore[attr-defined]
        return render(request, f"{TEMPLATE_QUEUE}#queue-list", context)
    return render(request, TEMPLATE_QUEUE, context)


def _timeline_context(
    request: HttpRequest, occurrence_id: Any, cursor: HistoryCursor | None = None
) -> dict[str, Any]:
    """The timeline page: one window of the events (``cursor``; the newest by default,
    which is what the answer to a refused decision shows)."""
    tenants, links = _operator(request)
    timeline = timeline_get(
        occurrence_id=occurrence_id, tenant_ids=[t.pk for t in tenants], cursor=cursor
    )
    if timeline is None:
        raise Http404("No such occurrence in your tenants.")
    now = timezone.now()
    command = timeline.commands[-1] if timeline.commands else None
    holder, db_now = takes.take_holder(occurrence_id=timeline.occurrence.pk)
    return {
        **links,
        "holder": holder,
        "on_it": presenters.on_it(holder, db_now, request.user.pk),
        "mine": holder is not None and holder.user_id == request.user.pk,
        "take_minutes": settings.OPERATIONS_TAKE_MINUTES,
        "timeline": timeline,
        "occurrence": timeline.occurrence,
        "command": command,
        "dimensions": presenters.dimensions(timeline, now),
        "why": presenters.why_nothing_runs(timeline),
        "why_title": presenters.why_title(timeline),
        "actions": presenters.action_forms(
            command, timeline.occurrence.tool.adapter, timeline.decisions
        ),
        # What every decision's form says it was shown.
        "seen_state": operations.seen_state(command.state, max(e.number for e in timeline.epochs))
        if command and timeline.epochs
        else "",
        "rows_html": render_rows(
            "reconciliation/timeline_rows.html", {"rows": presenters.timeline_rows(timeline)}
        ),
        "timeline_caption": presenters.timeline_caption(timeline),
        "timeline_links": presenters.timeline_links(timeline),
        "money": presenters.money_lines(
            next((p.arguments for p in timeline.proposals if p.is_current), {})
        ),
    }


@require_GET
@console_login_required
def timeline(request: HttpRequest, occurrence_id: Any) -> HttpResponse:
    # The window of the events asked for with ?before= or ?after= (an event id, as on the
    # review page); anything else is the newest.
    cursor = HistoryCursor.parse(request.GET.get("before"), request.GET.get("after"))
    return render(request, TEMPLATE_TIMELINE, _timeline_context(request, occurrence_id, cursor))


@require_POST
@console_login_required
def command_action(request: HttpRequest, command_id: Any, action: str) -> HttpResponse:
    if action not in presenters.ACTION_SLUGS:
        raise Http404("No such action.")
    tenants, _ = _operator(request)
    pk = parse_uuid(str(command_id))
    command = (
        Command.objects.filter(pk=pk, tenant__in=tenants).only("pk", "occurrence_id").first()
        if pk
        else None
    )
    if command is None:
        raise Http404("No such command in your tenants.")
    # Who decides, on what note, and on which state their page showed (the forms' hidden
    # seen_state): a decision made on a page another decision has overtaken is refused.
    who: dict[str, Any] = {
        "command_id": pk,
        "operator": request.user.get_username(),
        "note": request.POST.get("note", ""),
        "seen": request.POST.get("seen_state") or None,
    }
    try:
        if action == "query-effect":
            done = operations.command_query_effect(**who)
        elif action == "reconcile":
            done = operations.command_reconcile(
                **who,
                outcome=request.POST.get("outcome", ""),
                evidence=request.POST.get("evidence", ""),
            )
        elif action == "accept-ambiguity":
            done = operations.command_accept_ambiguity(**who)
        elif action == "retry":
            done = operations.command_retry(**who)
        else:
            done = operations.command_compensate(
                **who, manual_evidence=request.POST.get("manual_evidence", "")
            )
    except ServiceError as refusal:
        if refusal.status == 409:
            # Refused by the state: back to the timeline as it stands now, the refusal said
            # there (post/redirect/get: a reload shows the page again, never re-sends).
            messages.error(request, refusal.message, extra_tags=f"refusal {refusal.code}")
            return redirect(reverse("reconciliation:timeline", args=[command.occurrence_id]))
        # Input the form itself requires (a note, an outcome, evidence): the page with why.
        context = _timeline_context(request, command.occurrence_id)
        context["notice"] = {"level": "error", "text": refusal.message}
        status = refusal.status if 400 <= refusal.status < 500 else 409
        return render(request, TEMPLATE_TIMELINE, context, status=status)
    messages.success(request, done.message)
    return redirect(reverse("reconciliation:timeline", args=[command.occurrence_id]))


TAKE_MOVES = ("take", "release")


def _back(request: HttpRequest, occurrence_id: Any) -> str:
    """Where a take's answer leads: the page its form was on (the queue with its filters,
    or the timeline), never anywhere off the operations pages."""
    back = request.POST.get("back", "")
    if back.startswith(reverse("reconciliation:queue")) and url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}
    ):
        return back
    return reverse("reconciliation:timeline", args=[occurrence_id])


@require_POST
@console_login_required
def occurrence_take(request: HttpRequest, occurrence_id: Any, move: str) -> HttpResponse:
    """ "I'm on it", taking it over (the form names the holder its page showed, and the
    operator confirmed), or letting it go; refusals said on the page it leads back to."""
    if move not in TAKE_MOVES:
        raise Http404("No such action.")
    tenants, _ = _operator(request)
    tenant_ids = [t.pk for t in tenants]
    back = _back(request, occurrence_id)
    try:
        if move == "take":
            confirmed = request.POST.get("confirm") == "yes"
            message = takes.occurrence_take(
                occurrence_id=occurrence_id,
                tenant_ids=tenant_ids,
                user=request.user,
                take_over=request.POST.get("take_over") if confirmed else None,
            ).message
        else:
            message = takes.occurrence_release(
                occurrence_id=occurrence_id, tenant_ids=tenant_ids, user=request.user
            )
    except ServiceError as refusal:
        if refusal.status == 404:
            raise Http404(refusal.message) from refusal
        messages.error(request, refusal.message, extra_tags=f"refusal {refusal.code}")
        return redirect(back)
    messages.success(request, message)
    return redirect(back)
