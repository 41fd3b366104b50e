"""The reviewer's inbox (``/reviews/``): what waits for a decision, filtered, paged, polled
for news; and the header's tenant switcher."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from approvals.models import Occurrence
from approvals.reviews.bulk import BULK_MAX
from approvals.reviews.selectors import inbox_tools
from approvals.web.forms import (
    STATE_ALL,
    STATE_WENT_WRONG,
    InboxFilterForm,
    TenantSwitchForm,
)
from approvals.web.jinja import render_rows
from approvals.web.presenters.inbox import inbox_list, inbox_stamp
from approvals.web.selectors.access import console_access
from approvals.web.selectors.inbox import (
    InboxFreshness,
    InboxQuery,
    inbox_last_event,
    inbox_page,
    inbox_total,
)
from approvals.web.shell import (
    SESSION_TENANT,
    HtmxHttpRequest,
    _scope,
    chrome,
    console_login_required,
)

INBOX_PAGE_SIZE = 25


@require_GET
@console_login_required
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    access = console_access(request.user)
    scope = _scope(request, access)
    contracts = inbox_tools()
    tools = {contract.name: contract.pk for contract in contracts.values()}
    form = InboxFilterForm(request.GET, tools=list(tools))
    tool, state = form.filters()
    narrowing = form.narrowing()
    tenant_ids = [scope.pk] if scope else access.tenant_ids
    went_wrong = state == STATE_WENT_WRONG
    query = InboxQuery(
        tenant_ids=tenant_ids,
        tool_id=tools.get(tool),
        status=(Occurrence.Status.CLAIMED if went_wrong else ("" if state == STATE_ALL else state)),
        went_wrong_for=request.user.pk if went_wrong else None,
        requested_by=narrowing.requester,
        run_id=narrowing.run,
        amount_min=narrowing.amount_min,
        amount_max=narrowing.amount_max,
        reader_id=request.user.pk,
    )
    # The stamp first, from two aggregates: a poll that finds nothing new ends here. The
    # count's statement also reads the rule versions that route to the reader: the query
    # it answers with orders the page by them.
    counted = inbox_total(query)
    total, last_change, query = counted.total, counted.last_change, counted.query
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
    rendered = inbox_stamp(
        fresh,
        tenant_ids=tenant_ids,
        tool=tool,
        state=state,
        page=number,
        now=timezone.now(),
        narrowing=narrowing.query(),
        routing=(query.routed_versions, query.fallback_versions),
    )
    if request.htmx and request.GET.get("rendered") == rendered:
        return HttpResponse(status=204)

    listing = inbox_list(
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
        narrowing=narrowing.query(),
    )
    context = {
        **chrome(request, access),
        **listing,
        "form": form,
        "tool_choices": form.tool_choices,
        "page": page,
        "show_tenant": scope is None and len(access.tenants) > 1,
        "has_access": bool(access.tenants),
        "narrowing": narrowing,
        "bulk_max": BULK_MAX,
    }
    context["rows_html"] = render_rows(
        "approvals/inbox_rows.html",
        {
            "rows": context.get("rows", []),
            "show_tenant": context["show_tenant"],
            "selectable": state == Occurrence.Status.PENDING_REVIEW,
        },
    )
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
