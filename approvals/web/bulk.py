"""Bulk review (``/reviews/bulk/``): the requests selected in the inbox on one page, each
with its exact canonical JSON and full digest, and one decision for all of them
(``approvals.reviews.bulk``). After a decision the page is read again from the database,
whether the batch was written or refused."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from approvals.errors import InputError, ServiceError
from approvals.reviews.bulk import BULK_MAX, BulkItem, occurrences_approve, occurrences_reject
from approvals.web.forms import DIGEST_VALIDATOR
from approvals.web.presenters.bulk import Reader, bulk_rows, decided_notice
from approvals.web.selectors.access import ConsoleAccess, console_access
from approvals.web.selectors.bulk import bulk_occurrences
from approvals.web.shell import (
    HtmxHttpRequest,
    Notice,
    chrome,
    console_login_required,
)

APPROVE, REJECT = "approve", "reject"
NOT_A_REVIEWER = "Only reviewers can decide requests, and you are not a reviewer of any tenant."


class BulkDecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[(APPROVE, "Approve"), (REJECT, "Reject")])
    reason = forms.CharField(required=False, max_length=2000)


def _too_many(count: int) -> InputError:
    return InputError(
        "batch_too_large",
        f"A bulk review decides at most {BULK_MAX} requests; {count} were selected. "
        "Select fewer in the inbox.",
        "occurrences",
    )


def _ids(values: list[str]) -> list[uuid.UUID]:
    """The selected ids, in order, once each; bad input is an InputError (a 400)."""
    if len(values) > BULK_MAX:
        raise _too_many(len(values))
    ids: list[uuid.UUID] = []
    for value in values:
        try:
            pk = uuid.UUID(value)
        except ValueError:
            raise InputError("bad_id", "A selected request id is not valid.", "ids") from None
        if pk not in ids:
            ids.append(pk)
    return ids


def _items(values: list[str]) -> list[BulkItem]:
    """The form's ``item`` fields, ``<id>:<version>:<digest>``: what the page showed."""
    if len(values) > BULK_MAX:
        raise _too_many(len(values))
    items = []
    for value in values:
        pk, _, rest = value.partition(":")
        version, _, digest = rest.partition(":")
        try:
            DIGEST_VALIDATOR(digest)
            items.append(BulkItem(uuid.UUID(pk), int(version), digest))
        except (ValueError, forms.ValidationError):
            raise InputError("bad_item", "The form was not sent as the page made it.") from None
    return items


def _reviewer_tenants(access: ConsoleAccess) -> list[int]:
    tenant_ids = [pk for pk in access.tenant_ids if access.is_reviewer(pk)]
    if not tenant_ids:
        raise PermissionDenied(NOT_A_REVIEWER)
    return tenant_ids


@require_http_methods(["GET", "POST"])
@console_login_required
def bulk_review(request: HtmxHttpRequest) -> HttpResponse:
    access = console_access(request.user)
    tenant_ids = _reviewer_tenants(access)
    if request.method == "POST":
        return _decide(request, access, tenant_ids)
    try:
        ids = _ids(request.GET.getlist("ids"))
    except InputError as error:
        return _render(request, access, tenant_ids, [], errors=[error.message], status=400)
    return _render(request, access, tenant_ids, ids)


def _decide(request: HtmxHttpRequest, access: ConsoleAccess, tenant_ids: list[int]) -> HttpResponse:
    form = BulkDecisionForm(request.POST)
    values = request.POST.getlist("item")
    ids = _ids_of(values)
    try:
        items = _items(values)
        if not form.is_valid():
            raise InputError("bad_decision", "Choose approve or reject.", "decision")
        approving = form.cleaned_data["decision"] == APPROVE
        if approving:
            result = occurrences_approve(reviewer=request.user, items=items, tenant_ids=tenant_ids)
        else:
            result = occurrences_reject(
                reviewer=request.user,
                items=items,
                tenant_ids=tenant_ids,
                reason=form.cleaned_data["reason"],
            )
    except InputError as error:
        return _render(request, access, tenant_ids, ids, errors=[error.message], status=400)
    except ServiceError as error:
        refused = (error.details or {}).get("occurrence_id")
        return _render(
            request,
            access,
            tenant_ids,
            ids,
            # The batch's own words (they name the request), not ``refusal``'s generic ones.
            notice=Notice("error", error.message),
            refused=uuid.UUID(refused) if refused else None,
            status=error.status,
        )
    return _render(request, access, tenant_ids, ids, notice=decided_notice(result, approving))


def _ids_of(values: list[str]) -> list[uuid.UUID]:
    """The ids a submission names, for reading the page again (bad ones left out)."""
    ids: list[uuid.UUID] = []
    for value in values[:BULK_MAX]:
        try:
            pk = uuid.UUID(value.partition(":")[0])
        except ValueError:
            continue
        if pk not in ids:
            ids.append(pk)
    return ids


def _render(
    request: HtmxHttpRequest,
    access: ConsoleAccess,
    tenant_ids: list[int],
    ids: list[uuid.UUID],
    *,
    errors: list[str] | None = None,
    notice: Notice | None = None,
    refused: uuid.UUID | None = None,
    status: int = 200,
) -> HttpResponse:
    occurrences = bulk_occurrences(ids=ids, tenant_ids=tenant_ids)
    user = request.user
    reader = Reader(user.pk, user.get_username(), getattr(user, "email", "") or "")
    rows, differing = bulk_rows(occurrences, reader=reader, refused=refused, now=timezone.now())
    pending = [row for row in rows if row.pending]
    tools = {row.occurrence.tool_id for row in rows}
    context: dict[str, Any] = {
        **chrome(request, access),
        "rows": rows,
        "differing": differing,
        "bulk_max": BULK_MAX,
        "missing": len(ids) - len(rows),
        "decidable": bool(rows) and len(pending) == len(rows) and len(tools) == 1,
        "mixed_tools": len(tools) > 1,
        "own": [row for row in rows if row.own],
        "without_decided": _without_url(pending) if pending and len(pending) < len(rows) else "",
        "errors": errors or [],
        "notice": notice,
    }
    return render(request, "approvals/bulk.html", context, status=status)


def _without_url(rows: list[Any]) -> str:
    """The page again with only the requests still pending."""
    query = urlencode([("ids", str(row.occurrence.pk)) for row in rows])
    return f"{reverse('approvals:bulk')}?{query}"
