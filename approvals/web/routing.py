"""Admins' routing page (``/manage/routing/``): a tenant's reviewer groups (members, Slack
and webhook channels, and which channel keeps failing) and its routing rules, each change
a new version with its audit event (``approvals.routing.changes``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.db.models import Count, Max, Q
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables
from django.views.decorators.http import require_GET, require_POST

from approvals.access.encryption import Purpose
from approvals.canonical.money import currency_exponent
from approvals.errors import InputError
from approvals.models import (
    Channel,
    Membership,
    NotificationDelivery,
    ReviewerGroup,
    RoutingRule,
    RoutingRuleVersion,
    Tenant,
    ToolContract,
)
from approvals.notifications import slack_app
from approvals.routing.changes import (
    reviewer_group_save,
    routing_rule_remove,
    routing_rule_save,
)
from approvals.web.handoff import Handoff, handoff_put, handoff_take
from approvals.web.money import format_money
from approvals.web.presenters.routing import band_text
from approvals.web.shell import AdminScope, HtmxHttpRequest, admin_scope, console_login_required

TEMPLATE = "approvals/routing.html"
# The session entry that carries a group's new webhook signing secret from the POST that
# minted it to the page that shows it once (approvals.web.handoff).
SECRET_HANDOFF = "webhook_secret_handoff"
# A channel with this many failed deliveries in the last day shows as failing.
FAILING_AFTER = 1
FAILING_WINDOW = timedelta(days=1)


class GroupForm(forms.Form):
    tenant = forms.CharField(required=False)
    name = forms.CharField(max_length=100)
    members = forms.TypedMultipleChoiceField(coerce=int, required=False)
    slack_webhook_url = forms.CharField(required=False, max_length=2000, strip=True)
    remove_slack = forms.BooleanField(required=False)
    slack_bot_token = forms.CharField(required=False, max_length=300, strip=True)
    slack_channel_id = forms.CharField(required=False, max_length=32, strip=True)
    remove_slack_app = forms.BooleanField(required=False)
    webhook_url = forms.CharField(required=False, max_length=2000, strip=True)
    rotate_secret = forms.BooleanField(required=False)
    remove_webhook = forms.BooleanField(required=False)

    def __init__(self, data: Any = None, *, members: list[tuple[int, str]]) -> None:
        super().__init__(data)
        field = self.fields["members"]
        assert isinstance(field, forms.TypedMultipleChoiceField)
        field.choices = members


class RuleForm(forms.Form):
    tenant = forms.CharField(required=False)
    tool = forms.CharField(max_length=100)
    name = forms.CharField(max_length=100)
    groups = forms.TypedMultipleChoiceField(coerce=int)
    fallback_group = forms.TypedChoiceField(coerce=int, required=False, empty_value=None)
    currency = forms.CharField(required=False, max_length=3)
    amount_over = forms.CharField(required=False, max_length=30)
    amount_up_to = forms.CharField(required=False, max_length=30)

    def __init__(self, data: Any = None, *, groups: list[tuple[int, str]]) -> None:
        super().__init__(data)
        for name in ("groups", "fallback_group"):
            field = self.fields[name]
            assert isinstance(field, forms.TypedChoiceField | forms.TypedMultipleChoiceField)
            field.choices = [("", "None"), *groups] if name == "fallback_group" else groups

    def minor(self, field: str) -> int | None:
        """An amount typed in the currency's units ("500.00") as minor units."""
        text = (self.cleaned_data.get(field) or "").replace(",", "").strip()
        if not text:
            return None
        digits = currency_exponent((self.cleaned_data.get("currency") or "").upper())
        try:
            value = Decimal(text) * (10 ** (digits or 0))
        except InvalidOperation:
            raise InputError("invalid_band", f"{text!r} is not an amount.", field) from None
        if value != value.to_integral_value():
            raise InputError("invalid_band", f"{text} has too many decimals.", field)
        return int(value)


@dataclass(frozen=True)
class GroupRow:
    group: ReviewerGroup
    members: list[str]
    failing: list[tuple[str, int, str]]  # (channel, failed in the last day, last error)


@dataclass(frozen=True)
class GroupFields:
    """What the group form shows: a group chosen to change, or what was posted."""

    group: int | None = None
    name: str = ""
    members: frozenset[int] = frozenset()
    webhook_url: str = ""
    has_slack: bool = False  # set: the URL itself is never shown again
    has_webhook: bool = False
    has_slack_app: bool = False  # a bot token is set: never shown again
    slack_channel_id: str = ""  # the app's channel (not a secret)

    @classmethod
    def of(cls, group: ReviewerGroup) -> GroupFields:
        return cls(
            group.pk,
            group.name,
            frozenset(m.pk for m in group.members.all()),
            group.webhook_url,
            bool(group.slack_webhook_encrypted),
            bool(group.webhook_url),
            bool(group.slack_bot_token_encrypted),
            group.slack_channel_id,
        )

    @classmethod
    def posted(cls, data: QueryDict, group: ReviewerGroup | None) -> GroupFields:
        """The posted values, shown again with the errors; the Slack URL and the bot token
        are not."""
        members = {int(m) for m in data.getlist("members") if str(m).isdigit()}
        return cls(
            group.pk if group else None,
            str(data.get("name", "")),
            frozenset(members),
            str(data.get("webhook_url", "")),
            bool(group and group.slack_webhook_encrypted),
            bool(group and group.webhook_url),
            bool(group and group.slack_bot_token_encrypted),
            str(data.get("slack_channel_id", ""))[:32],
        )


@dataclass(frozen=True)
class RuleFields:
    """What the rule form shows: a rule chosen to change (its current version), or what
    was posted."""

    tool: str = ""
    name: str = ""
    groups: frozenset[int] = frozenset()
    fallback: int | None = None
    currency: str = ""
    amount_over: str = ""
    amount_up_to: str = ""

    @classmethod
    def of(cls, rule: RoutingRule, version: RoutingRuleVersion) -> RuleFields:
        def units(minor: int | None) -> str:
            if minor is None:
                return ""
            try:
                return format_money(minor, version.currency).split(" ", 1)[1]
            except ValueError:
                return str(minor)

        return cls(
            rule.tool.name,
            rule.name,
            frozenset(g.pk for g in version.groups.all()),
            version.fallback_group_id,
            version.currency,
            units(version.amount_over_minor),
            units(version.amount_up_to_minor),
        )

    @classmethod
    def posted(cls, data: QueryDict) -> RuleFields:
        fallback = str(data.get("fallback_group", ""))
        return cls(
            str(data.get("tool", "")),
            str(data.get("name", "")),
            frozenset(int(g) for g in data.getlist("groups") if str(g).isdigit()),
            int(fallback) if fallback.isdigit() else None,
            str(data.get("currency", "")),
            str(data.get("amount_over", "")),
            str(data.get("amount_up_to", "")),
        )


@dataclass(frozen=True)
class RuleRow:
    rule: RoutingRule
    current: RoutingRuleVersion
    band: str
    groups: list[str]
    history: list[tuple[RoutingRuleVersion, str, list[str]]]


def _tenant(scope: AdminScope, slug: str) -> Tenant:
    if not slug:
        return scope.tenants[0]
    tenant = scope.tenant(slug)
    if tenant is None:
        raise Http404("You are no admin of that tenant.")
    return tenant


def _group(tenant: Tenant, pk: str | int | None) -> ReviewerGroup | None:
    """The tenant's group ``pk`` (None when none is asked for); another tenant's is a 404."""
    if pk in (None, ""):
        return None
    try:
        key = int(pk)  # type: ignore[arg-type]
    except ValueError:
        raise Http404("No such group in this tenant.") from None
    group = ReviewerGroup.objects.filter(tenant=tenant, pk=key).first()
    if group is None:
        raise Http404("No such group in this tenant.")
    return group


def _rule_fields(tenant: Tenant, pk: str | None) -> RuleFields:
    """The form filled with the tenant's active rule ``pk`` (empty when none is asked
    for); another tenant's rule, or a removed one, is a 404."""
    if not pk:
        return RuleFields()
    version = None
    if pk.isdigit():
        version = (
            RoutingRuleVersion.objects.filter(
                rule__tenant=tenant, rule_id=int(pk), is_current=True, is_active=True
            )
            .select_related("rule__tool")
            .prefetch_related("groups")
            .first()
        )
    if version is None:
        raise Http404("No such rule in this tenant.")
    return RuleFields.of(version.rule, version)


def _people(tenant: Tenant) -> list[tuple[int, str]]:
    users = (
        get_user_model()
        .objects.filter(
            memberships__tenant=tenant,
            memberships__role__in=[Membership.Role.REVIEWER, Membership.Role.ADMIN],
        )
        .distinct()
        .order_by("username")
    )
    return [(u.pk, u.get_username()) for u in users]


def _failing(tenant: Tenant) -> dict[int, list[tuple[str, int, str]]]:
    since = timezone.now() - FAILING_WINDOW
    rows = (
        NotificationDelivery.objects.filter(
            tenant=tenant, group__isnull=False, created_at__gte=since
        )
        # Given up, or failed at its last attempt and waiting for the next; a Slack app's
        # reply waiting for its thread's first message to be posted is not a failure.
        .filter(
            Q(state=NotificationDelivery.State.FAILED)
            | (
                Q(state=NotificationDelivery.State.PENDING)
                & ~Q(last_error="")
                & ~Q(last_error=slack_app.WAITING)
            )
        )
        .values("group_id", "channel")
        .annotate(n=Count("pk"), last=Max("created_at"))
    )
    found: dict[int, list[tuple[str, int, str]]] = {}
    for row in rows:
        if row["n"] < FAILING_AFTER:
            continue
        last = (
            NotificationDelivery.objects.filter(
                group_id=row["group_id"], channel=row["channel"], created_at__gte=since
            )
            .exclude(last_error="")
            .order_by("-created_at")
            .values_list("last_error", flat=True)
            .first()
        )
        label = (
            str(Channel(row["channel"]).label)
            if row["channel"] in Channel.values
            else row["channel"]
        )
        found.setdefault(row["group_id"], []).append((label, row["n"], last or ""))
    return found


def _render(
    request: HttpRequest,
    scope: AdminScope,
    tenant: Tenant,
    *,
    fields: GroupFields | None = None,
    rule: RuleFields | None = None,
    handoff: Handoff | None = None,
    errors: list[str] | None = None,
    refused: str = "",  # the form whose post was refused: "group" or "rule"
    status: int = 200,
) -> HttpResponse:
    people = _people(tenant)
    groups = list(ReviewerGroup.objects.filter(tenant=tenant).prefetch_related("members"))
    failing = _failing(tenant)
    group_rows = [
        GroupRow(g, sorted(m.get_username() for m in g.members.all()), failing.get(g.pk, []))
        for g in groups
    ]
    rules = []
    for routing_rule in RoutingRule.objects.filter(tenant=tenant).select_related("tool"):
        versions = list(
            routing_rule.versions.select_related("fallback_group", "created_by")
            .prefetch_related("groups")
            .order_by("-version")
        )
        current = next((v for v in versions if v.is_current), None)
        if current is None:
            continue
        history = [(v, band_text(v), sorted(g.name for g in v.groups.all())) for v in versions]
        rules.append(
            RuleRow(
                routing_rule,
                current,
                band_text(current),
                history[0][2] if current.is_active else [],
                history,
            )
        )
    context = scope.context(
        "routing",
        tenant=tenant,
        groups=group_rows,
        rules=rules,
        people=people,
        tools=list(ToolContract.objects.order_by("name").values_list("name", flat=True)),
        fields=fields or GroupFields(),
        rule=rule or RuleFields(),
        handoff=handoff,
        errors=errors or [],
        refused=refused,
        any_failing=any(row.failing for row in group_rows),
    )
    response = render(request, TEMPLATE, context, status=status)
    if handoff is not None:
        add_never_cache_headers(response)
    return response


@require_GET
@console_login_required
def routing(request: HtmxHttpRequest) -> HttpResponse:
    """The page; ``?group=`` opens the group form on that group, its members ticked (the
    form's group picker asks for the form alone, an htmx partial); ``?rule=`` opens the
    rule form on that rule's current version."""
    scope = admin_scope(request)
    tenant = _tenant(scope, request.GET.get("tenant", ""))
    group = _group(tenant, request.GET.get("group"))
    fields = GroupFields.of(group) if group is not None else GroupFields()
    rule = _rule_fields(tenant, request.GET.get("rule"))
    if request.htmx and request.htmx.target == "group-fields":
        context = {"fields": fields, "people": _people(tenant), "tenant": tenant}
        return render(request, f"{TEMPLATE}#group-fields", context)
    handoff = handoff_take(
        request, SECRET_HANDOFF, subject=tenant.pk, purpose=Purpose.WEBHOOK_SECRET_HANDOFF
    )
    return _render(request, scope, tenant, fields=fields, rule=rule, handoff=handoff)


def _back(tenant: Tenant) -> HttpResponse:
    return redirect(f"{reverse('approvals:routing')}?tenant={tenant.slug}")


@sensitive_variables("saved", "data", "app_token")
@sensitive_post_parameters("slack_webhook_url", "slack_bot_token")
@require_POST
@console_login_required
def routing_group_save(request: HttpRequest) -> HttpResponse:
    scope = admin_scope(request)
    tenant = _tenant(scope, request.POST.get("tenant", ""))
    group = _group(tenant, request.POST.get("group"))
    form = GroupForm(request.POST, members=_people(tenant))
    if not form.is_valid():
        errors = [f"{k}: {' '.join(str(e) for e in v)}" for k, v in form.errors.items()]
        fields = GroupFields.posted(request.POST, group)
        return _render(
            request, scope, tenant, fields=fields, errors=errors, refused="group", status=422
        )
    data = form.cleaned_data
    slack = "" if data["remove_slack"] else (data["slack_webhook_url"] or None)
    webhook = data["webhook_url"] if data["webhook_url"] or group is None else None
    if group is not None and data["remove_webhook"]:
        webhook = ""
    # Empty keeps the stored token and channel; the box removes the app.
    app_token = "" if data["remove_slack_app"] else (data["slack_bot_token"] or None)
    app_channel = "" if data["remove_slack_app"] else (data["slack_channel_id"] or None)
    try:
        saved = reviewer_group_save(
            tenant=tenant,
            admin=request.user,
            name=data["name"],
            member_ids=data["members"],
            slack_webhook_url=slack,
            webhook_url=webhook,
            rotate_secret=data["rotate_secret"],
            group=group,
            slack_bot_token=app_token,
            slack_channel_id=app_channel,
        )
    except InputError as exc:
        fields = GroupFields.posted(request.POST, group)
        return _render(
            request, scope, tenant, fields=fields, errors=[exc.message], refused="group", status=422
        )
    messages.success(request, f"Saved group {saved.group.name}.")
    if saved.secret:
        # Post/redirect/get: the page after the redirect shows the secret once (the
        # console keeps it encrypted and never shows it again), and a reload posts nothing.
        handoff_put(
            request,
            SECRET_HANDOFF,
            subject=tenant.pk,
            secret=saved.secret,
            purpose=Purpose.WEBHOOK_SECRET_HANDOFF,
            label=saved.group.name,
        )
    return _back(tenant)


@require_POST
@console_login_required
def routing_rule_save_view(request: HttpRequest) -> HttpResponse:
    scope = admin_scope(request)
    tenant = _tenant(scope, request.POST.get("tenant", ""))
    groups = list(ReviewerGroup.objects.filter(tenant=tenant).values_list("pk", "name"))
    form = RuleForm(request.POST, groups=groups)
    if not form.is_valid():
        errors = [f"{k}: {' '.join(str(e) for e in v)}" for k, v in form.errors.items()]
        rule = RuleFields.posted(request.POST)
        return _render(request, scope, tenant, rule=rule, errors=errors, refused="rule", status=422)
    data = form.cleaned_data
    try:
        version = routing_rule_save(
            tenant=tenant,
            admin=request.user,
            tool=data["tool"],
            name=data["name"],
            group_ids=data["groups"],
            fallback_group_id=data["fallback_group"],
            currency=data["currency"] or "",
            amount_over_minor=form.minor("amount_over"),
            amount_up_to_minor=form.minor("amount_up_to"),
        )
    except InputError as exc:
        rule = RuleFields.posted(request.POST)
        return _render(
            request, scope, tenant, rule=rule, errors=[exc.message], refused="rule", status=422
        )
    messages.success(
        request, f"Saved rule {version.rule.name} for {data['tool']}: version {version.version}."
    )
    return _back(tenant)


@require_POST
@console_login_required
def routing_rule_remove_view(request: HttpRequest, rule_id: int) -> HttpResponse:
    scope = admin_scope(request)
    tenant = _tenant(scope, request.POST.get("tenant", ""))
    if not RoutingRule.objects.filter(tenant=tenant, pk=rule_id).exists():
        raise Http404("No such rule in this tenant.")
    if routing_rule_remove(tenant=tenant, admin=request.user, rule_id=rule_id):
        messages.success(request, "Removed the rule; the requests it routed keep naming it.")
    return _back(tenant)
