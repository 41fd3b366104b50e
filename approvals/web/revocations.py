"""Admins' revocation pages (``/manage/revocations/``): filter and preview the approvals
a bulk revocation would revoke, revoke them as one batch, read a batch back, and revoke
one approval by its fingerprint."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import ServiceError
from approvals.models import Approval, Membership, RuntimeKey
from approvals.reviews.revocation import (
    RevocationFilter,
    approval_revoke,
    approval_revoke_refusal,
    approvals_revocable,
    approvals_revoke_by_admin,
)
from approvals.reviews.selectors import approvals_with_fingerprint, tool_ids
from approvals.web.money import MoneyLine, money_lines
from approvals.web.shell import (
    AdminScope,
    Notice,
    _utc,
    admin_scope,
    age,
    console_login_required,
    duration,
)

TEMPLATE_REVOCATIONS = "approvals/revocations.html"


TEMPLATE_BATCH = "approvals/revocations_batch.html"


# One confirmation revokes at most this many approvals: the admin sees every one of them.
MAX_BULK = 1000


# A confirmation older than this is refused: the admin previews again.
PREVIEW_MAX_AGE = 30 * 60


# The salt previews are signed with: its value is kept (a preview signed before a change of
# it would no longer verify), though the module that named it is approvals.web now.
BATCH_SALT = "approvals.admin_views.bulk-revocation"


# Results of the last few confirmations, for the result page after the redirect.
SESSION_BATCHES = "revocation_batches"


KEEP_BATCHES = 5


REASON_ERRORS = {
    "required": "Say why: the reason is recorded with each revocation.",
    "max_length": "Keep the reason under 2000 characters.",
}


def _until(moment: datetime, now: datetime) -> str:
    seconds = (moment - now).total_seconds()
    if seconds <= 0:
        return "expired"
    if seconds < 60:
        return "in under a minute"
    return f"in {duration(seconds)}"


class RevocationFilterForm(forms.Form):
    tenant = forms.ChoiceField(required=False)
    tool = forms.ChoiceField(required=False)
    approver = forms.ChoiceField(required=False)
    runtime_key = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    issued_before = forms.DateTimeField(
        required=False,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        error_messages={"invalid": "Enter a time as YYYY-MM-DD HH:MM (UTC)."},
    )

    def __init__(
        self,
        data: Any,
        *,
        scope: AdminScope,
        tools: list[str],
        approvers: list[str],
        keys: list[RuntimeKey],
    ) -> None:
        super().__init__(data)
        self.scope = scope
        self.keys = {key.pk: key for key in keys}
        many = len(scope.tenants) > 1
        self._choices(
            "tenant", [("", "All my admin tenants"), *((t.slug, t.name) for t in scope.tenants)]
        )
        self._choices("tool", [("", "Any tool"), *((name, name) for name in tools)])
        self._choices("approver", [("", "Anyone"), *((name, name) for name in approvers)])
        self._choices(
            "runtime_key",
            [
                ("", "Any key"),
                *(
                    (
                        str(key.pk),
                        f"{key.name} ({key.prefix}…)"
                        + (f" · {key.tenant.name}" if many else "")
                        + ("" if key.is_active else " · deactivated"),
                    )
                    for key in keys
                ),
            ],
        )

    def _choices(self, name: str, choices: list[tuple[str, str]]) -> None:
        field = self.fields[name]
        assert isinstance(field, forms.ChoiceField)
        field.choices = choices

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        slug = data.get("tenant") or ""
        key_id = data.get("runtime_key")
        chosen = self.scope.tenant(slug) if slug else None
        if chosen is not None and key_id is not None and self.keys[key_id].tenant_id != chosen.pk:
            self.add_error("runtime_key", f"That key belongs to another tenant than {chosen.name}.")
        return data

    def tenant_ids(self) -> list[int]:
        chosen = self.scope.tenant(self.cleaned_data.get("tenant") or "")
        return [chosen.pk] if chosen else self.scope.tenant_ids

    def filters(self) -> RevocationFilter:
        data = self.cleaned_data
        return RevocationFilter(
            tool=data.get("tool") or "",
            approver=data.get("approver") or "",
            runtime_key_id=data.get("runtime_key"),
            issued_before=data.get("issued_before"),
        )

    def query(self) -> str:
        """The filters as the page's query string: a link that previews them again."""
        data = self.cleaned_data
        before = data.get("issued_before")
        pairs = {
            "tenant": data.get("tenant") or "",
            "tool": data.get("tool") or "",
            "approver": data.get("approver") or "",
            "runtime_key": str(data.get("runtime_key") or ""),
            "issued_before": f"{timezone.localtime(before, UTC):%Y-%m-%dT%H:%M}" if before else "",
        }
        return urlencode({"preview": "1", **{k: v for k, v in pairs.items() if v}})


def _approver_names(tenant_ids: list[int]) -> list[str]:
    """The approver filter's choices: the tenants' reviewers, and whoever approved an
    approval that is still issued (a reviewer removed since, whose account is suspect)."""
    issued_by = Approval.objects.filter(
        tenant_id__in=tenant_ids, state=Approval.State.ISSUED
    ).values("approver_id")
    users = get_user_model().objects.filter(
        Q(memberships__tenant_id__in=tenant_ids, memberships__role=Membership.Role.REVIEWER)
        | Q(pk__in=issued_by)
    )
    return list(users.order_by("username").values_list("username", flat=True).distinct())


def _filter_form(scope: AdminScope, data: Any) -> RevocationFilterForm:
    keys = list(
        RuntimeKey.objects.filter(tenant_id__in=scope.tenant_ids)
        .select_related("tenant")
        .order_by("tenant__name", "-is_active", "name")
    )
    return RevocationFilterForm(
        data,
        scope=scope,
        tools=list(tool_ids()),
        approvers=_approver_names(scope.tenant_ids),
        keys=keys,
    )


def _keys_of(scope: AdminScope, filters: RevocationFilter) -> dict[int, RuntimeKey]:
    """The runtime key a filter names, if the admin's tenants hold it."""
    keys = RuntimeKey.objects.filter(
        pk__in=[filters.runtime_key_id], tenant_id__in=scope.tenant_ids
    )
    return {key.pk: key for key in keys}


def _describe(filters: RevocationFilter, keys: dict[int, RuntimeKey]) -> list[str]:
    """The filters in words, for the preview's heading and the result page."""
    parts = []
    if filters.tool:
        parts.append(f"tool {filters.tool}")
    if filters.approver:
        parts.append(f"approved by {filters.approver}")
    if filters.runtime_key_id is not None:
        key = keys.get(filters.runtime_key_id)
        parts.append(f"proposed with key {key.name} ({key.prefix}…)" if key else "a runtime key")
    if filters.issued_before is not None:
        parts.append(f"issued before {_utc(filters.issued_before)}")
    return parts


@dataclass(frozen=True)
class ApprovalRow:
    """One approval as the preview and the result page list it."""

    approval: Approval
    money: list[MoneyLine]
    issued_ago: str
    expires_in: str
    # On the result page: what happened to it ("" in a preview).
    outcome: str = ""
    outcome_text: str = ""


def _approval_rows(approvals: list[Approval], now: datetime) -> list[ApprovalRow]:
    return [
        ApprovalRow(
            approval=approval,
            money=money_lines(approval.proposal.arguments),
            issued_ago=age(approval.issued_at, now),
            expires_in=_until(approval.expires_at, now),
        )
        for approval in approvals
    ]


_ROW_RELATIONS = ("tenant", "approver", "proposal", "occurrence__runtime_key")


@dataclass(frozen=True)
class Preview:
    rows: list[ApprovalRow]
    count: int
    batch: str  # the signed confirmation; "" when there is nothing to confirm

    @property
    def too_many(self) -> bool:
        return self.count > MAX_BULK


def _filters_data(filters: RevocationFilter) -> dict[str, Any]:
    before = filters.issued_before
    return {
        "tool": filters.tool,
        "approver": filters.approver,
        "key": filters.runtime_key_id,
        "before": before.isoformat() if before else None,
    }


def _filters_from(data: dict[str, Any]) -> RevocationFilter:
    before = data.get("before")
    return RevocationFilter(
        tool=data.get("tool") or "",
        approver=data.get("approver") or "",
        runtime_key_id=data.get("key"),
        issued_before=datetime.fromisoformat(before) if before else None,
    )


def _preview(
    request: HttpRequest,
    *,
    tenant_ids: list[int],
    filters: RevocationFilter,
    query: str,
    ids: list[int] | None = None,
) -> Preview:
    """What the filters select that is revocable now (only among ``ids`` if given), and the
    signed confirmation of exactly that list."""
    selected = approvals_revocable(tenant_ids=tenant_ids, filters=filters)
    if ids is not None:
        selected = selected.filter(pk__in=ids)
    selected = selected.select_related(*_ROW_RELATIONS).order_by("issued_at", "pk")
    approvals = list(selected[: MAX_BULK + 1])
    count = selected.count() if len(approvals) > MAX_BULK else len(approvals)
    rows = _approval_rows(approvals[:MAX_BULK], timezone.now())
    batch = ""
    if 0 < count <= MAX_BULK:
        batch = signing.dumps(
            {
                "u": request.user.pk,
                "t": tenant_ids,
                "f": _filters_data(filters),
                "q": query,
                "ids": [row.approval.pk for row in rows],
            },
            salt=BATCH_SALT,
            compress=True,
        )
    return Preview(rows=rows, count=count, batch=batch)


class RevokeBatchForm(forms.Form):
    batch = forms.CharField(max_length=60_000)
    reason = forms.CharField(max_length=2000, error_messages=REASON_ERRORS)


class RevokeFingerprintForm(forms.Form):
    fingerprint = forms.CharField(
        max_length=64,
        error_messages={
            "required": "Enter the approval's fingerprint, as the review page shows it.",
            "max_length": "A fingerprint is 16 characters.",
        },
    )
    reason = forms.CharField(max_length=2000, error_messages=REASON_ERRORS)


def _render_revocations(
    scope: AdminScope,
    *,
    data: Any = None,
    preview: Preview | None = None,
    filter_form: RevocationFilterForm | None = None,
    batch_form: RevokeBatchForm | None = None,
    fingerprint_form: RevokeFingerprintForm | None = None,
    fingerprint_notice: Notice | None = None,
    refused: Approval | None = None,
    status: int = 200,
) -> HttpResponse:
    form = filter_form or _filter_form(scope, data)
    described: list[str] = []
    query = ""
    if preview is None and data is not None and data.get("preview") and form.is_valid():
        query = form.query()
        preview = _preview(
            scope.request, tenant_ids=form.tenant_ids(), filters=form.filters(), query=query
        )
    if form.is_bound and form.is_valid():
        described = _describe(form.filters(), form.keys)
        query = form.query()
    chosen = scope.tenant(form.cleaned_data.get("tenant") or "") if form.is_bound else None
    context = scope.context(
        "revocations",
        form=form,
        preview=preview,
        described=described,
        scope_label=chosen.name if chosen else None,
        query=query,
        batch_form=batch_form,
        fingerprint_form=fingerprint_form,
        fingerprint_notice=fingerprint_notice,
        refused=refused,
        max_bulk=MAX_BULK,
        issued_before_value=_datetime_local(form),
    )
    return render(scope.request, TEMPLATE_REVOCATIONS, context, status=status)


def _datetime_local(form: RevocationFilterForm) -> str:
    """The issued-before input's value as the browser's datetime-local control wants it."""
    if not form.is_bound:
        return ""
    if form.is_valid() and form.cleaned_data.get("issued_before"):
        return f"{timezone.localtime(form.cleaned_data['issued_before'], UTC):%Y-%m-%dT%H:%M}"
    return str(form.data.get("issued_before", ""))


@require_GET
@console_login_required
def revocations(request: HttpRequest) -> HttpResponse:
    scope = admin_scope(request)
    data = request.GET if request.GET else None
    return _render_revocations(scope, data=data)


@require_POST
@console_login_required
def revocations_revoke(request: HttpRequest) -> HttpResponse:
    """Confirm a preview: revoke the previewed approvals that are still revocable."""
    scope = admin_scope(request)
    token = request.POST.get("batch", "")
    try:
        payload = signing.loads(token, salt=BATCH_SALT, max_age=PREVIEW_MAX_AGE)
    except signing.SignatureExpired:
        query = signing.loads(token, salt=BATCH_SALT).get("q", "")
        messages.warning(
            request,
            "That preview was more than 30 minutes old, so nothing was revoked. "
            "Here is the list as it is now: check it and confirm again.",
        )
        return redirect(f"{reverse('approvals:revocations')}?{query}")
    except signing.BadSignature:
        return HttpResponseBadRequest(
            "This confirmation does not come from a preview of the console. Preview again."
        )
    if payload.get("u") != request.user.pk:
        return HttpResponseBadRequest("This confirmation belongs to another person's preview.")
    filters = _filters_from(payload["f"])
    # Admin rights as they are now, not as they were at the preview.
    tenant_ids = [t for t in payload["t"] if t in scope.tenant_ids]
    previewed: list[int] = payload["ids"]
    form = RevokeBatchForm(request.POST)
    if not form.is_valid():
        preview = _preview(
            request, tenant_ids=tenant_ids, filters=filters, query=payload["q"], ids=previewed
        )
        return _render_revocations(
            scope,
            data=QueryDict(payload["q"]),
            preview=preview,
            batch_form=form,
            status=422,
        )
    batch_id = uuid.uuid4()
    approvals = filters.apply(Approval.objects.filter(tenant_id__in=tenant_ids, pk__in=previewed))
    try:
        revoked = approvals_revoke_by_admin(
            approvals=approvals,
            admin=request.user,
            reason=form.cleaned_data["reason"],
            batch=batch_id.hex,
            described=" · ".join(_describe(filters, _keys_of(scope, filters))) or "all",
        )
    except ServiceError as exc:
        raise PermissionDenied(exc.message) from exc
    batches = dict(request.session.get(SESSION_BATCHES, {}))
    batches[batch_id.hex] = {
        "previewed": previewed,
        "revoked": revoked,
        "tenants": tenant_ids,
        "filters": payload["f"],
        "query": payload["q"],
        "reason": form.cleaned_data["reason"],
        "at": timezone.now().isoformat(),
    }
    request.session[SESSION_BATCHES] = dict(list(batches.items())[-KEEP_BATCHES:])
    return redirect("approvals:revocations-batch", batch_id=batch_id)


@require_GET
@console_login_required
def revocations_batch(request: HttpRequest, batch_id: uuid.UUID) -> HttpResponse:
    """The result of one confirmation: each previewed approval as it stands now."""
    scope = admin_scope(request)
    record = request.session.get(SESSION_BATCHES, {}).get(batch_id.hex)
    if record is None:
        raise Http404(
            "This revocation's result is not in your session any more; the audit trail has "
            f"its approval.revoked events (batch {batch_id.hex})."
        )
    now = timezone.now()
    approvals = list(
        Approval.objects.filter(pk__in=record["previewed"], tenant_id__in=scope.tenant_ids)
        .select_related(*_ROW_RELATIONS, "command")
        .order_by("issued_at", "pk")
    )
    revoked = set(record["revoked"])
    rows = []
    for row in _approval_rows(approvals, now):
        if row.approval.pk in revoked:
            outcome, text = "revoked", "Revoked now"
        else:
            outcome = "skipped"
            text = approval_revoke_refusal(row.approval, now) or (
                "Not revoked: you are no longer an admin of its tenant, or it no longer "
                "matched the filters."
            )
        rows.append(
            ApprovalRow(
                approval=row.approval,
                money=row.money,
                issued_ago=row.issued_ago,
                expires_in=row.expires_in,
                outcome=outcome,
                outcome_text=text,
            )
        )
    filters = _filters_from(record["filters"])
    tenant_ids = [t for t in record["tenants"] if t in scope.tenant_ids]
    newer = approvals_revocable(tenant_ids=tenant_ids, filters=filters).count()
    keys = _keys_of(scope, filters)
    context = scope.context(
        "revocations",
        batch_id=batch_id.hex,
        rows=rows,
        revoked_count=len(revoked),
        previewed_count=len(record["previewed"]),
        skipped_count=len(record["previewed"]) - len(revoked),
        reason=record["reason"],
        at=datetime.fromisoformat(record["at"]),
        described=_describe(filters, keys),
        newer=newer,
        query=record["query"],
    )
    return render(request, TEMPLATE_BATCH, context)


@require_POST
@console_login_required
def revoke_fingerprint(request: HttpRequest) -> HttpResponse:
    """Revoke one approval by its fingerprint, or say precisely why it cannot be: a
    consumed approval names its command and the command's effect state."""
    scope = admin_scope(request)
    form = RevokeFingerprintForm(request.POST)
    if not form.is_valid():
        return _render_revocations(scope, fingerprint_form=form, status=422)
    fingerprint = form.cleaned_data["fingerprint"].strip().lower()
    approval = (
        approvals_with_fingerprint(fingerprint)
        .filter(tenant_id__in=scope.tenant_ids)
        .order_by("pk")
        .first()
    )
    if approval is None:
        form.add_error(
            "fingerprint",
            f"No approval of your tenants has the fingerprint {fingerprint}. An approval gets "
            "its fingerprint when the runtime picks up its token; before that, revoke it "
            "from its review page or with the filters below.",
        )
        return _render_revocations(scope, fingerprint_form=form, status=404)
    try:
        revoked = approval_revoke(
            approval=approval, admin=request.user, reason=form.cleaned_data["reason"]
        )
    except ServiceError as exc:
        raise PermissionDenied(exc.message) from exc
    if revoked:
        messages.success(
            request,
            f"Revoked approval {fingerprint} ({approval.tool_name}). A claim with its token "
            "now gets “revoked”.",
        )
        return redirect("approvals:revocations")
    approval = Approval.objects.select_related("command").get(pk=approval.pk)
    notice = Notice("error", approval_revoke_refusal(approval))
    return _render_revocations(
        scope, fingerprint_form=form, fingerprint_notice=notice, refused=approval, status=409
    )
