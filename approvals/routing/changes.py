"""Admins' changes to routing: reviewer groups, and rules (each change a new version),
every one audited with who changed what."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.views.decorators.debug import sensitive_variables

from approvals.access import encryption, tokens
from approvals.access.tenancy import User, require_role, username_of
from approvals.audit.record import audit_record
from approvals.callbacks.registry import url_check
from approvals.canonical.money import currency_exponent
from approvals.errors import InputError
from approvals.models import (
    Membership,
    ReviewerGroup,
    RoutingRule,
    RoutingRuleVersion,
    Tenant,
    ToolContract,
)
from approvals.vocabulary import AuditKind

_PURPOSE = encryption.Purpose.NOTIFICATION_SECRETS


def group_secret_decrypt(stored: str) -> str:
    """A group's Slack URL or webhook secret, or "" when none is set or no key reads it."""
    return encryption.secret_decrypt(stored, purpose=_PURPOSE) if stored else ""


# A Slack app's bot token, and a channel's id (public channels C…, private G…, DMs D…).
_BOT_TOKEN = re.compile(r"xoxb-[A-Za-z0-9-]{10,250}")
_CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]{6,30}")


@sensitive_variables("token")
def _slack_app(token: str | None, channel: str | None) -> tuple[str | None, str | None]:
    """The posted bot token and channel id, checked (None: keep the stored one). Neither
    the token nor any part of it is ever in the error."""
    if token is not None and token != "" and not _BOT_TOKEN.fullmatch(token):
        raise InputError(
            "invalid_slack_token",
            "A Slack bot token starts with xoxb- followed by letters, digits and dashes "
            "(the app's OAuth & Permissions page, Bot User OAuth Token).",
            "slack_bot_token",
        )
    if channel:
        channel = channel.strip().upper()
        if not _CHANNEL_ID.fullmatch(channel):
            raise InputError(
                "invalid_slack_channel",
                "Give the Slack channel's id (such as C0123ABCD: the channel's details, at the "
                "bottom), not its name.",
                "slack_channel_id",
            )
    return token, channel


def _name(value: str, what: str) -> str:
    value = (value or "").strip()
    if not value or len(value) > 100:
        raise InputError("invalid_name", f"Give the {what} a name of 1-100 characters.", "name")
    return value


@dataclass(frozen=True)
class GroupSaved:
    group: ReviewerGroup
    secret: str  # the generic webhook's signing secret: shown once, when minted


@sensitive_variables("slack_bot_token", "bot_token")
def reviewer_group_save(
    *,
    tenant: Tenant,
    admin: User,
    name: str,
    member_ids: list[int],
    slack_webhook_url: str | None = None,
    webhook_url: str | None = None,
    rotate_secret: bool = False,
    group: ReviewerGroup | None = None,
    slack_bot_token: str | None = None,
    slack_channel_id: str | None = None,
) -> GroupSaved:
    """Create or change a reviewer group of ``tenant``. A URL, bot token or channel id
    left None keeps the stored one, "" removes it (a Slack app needs both its token and
    its channel: removing one removes the app). A new generic webhook (or
    ``rotate_secret``) mints a signing secret, returned once. Members must be reviewers
    or admins of the tenant."""
    require_role(admin, tenant.pk, Membership.Role.ADMIN)
    name = _name(name, "group")
    allowed = set(
        Membership.objects.filter(
            tenant=tenant, role__in=[Membership.Role.REVIEWER, Membership.Role.ADMIN]
        ).values_list("user_id", flat=True)
    )
    members = sorted(set(member_ids))
    if not set(members) <= allowed:
        raise InputError(
            "invalid_member", "Members must be reviewers or admins of this tenant.", "members"
        )
    slack = url_check(slack_webhook_url, what="Slack webhook") if slack_webhook_url else None
    hook = url_check(webhook_url, what="webhook") if webhook_url else None
    bot_token, channel_id = _slack_app(slack_bot_token, slack_channel_id)
    _slack_app_complete(group, bot_token, channel_id)
    if group is not None and group.tenant_id != tenant.pk:
        raise InputError("not_found", "No such group in this tenant.", "group")
    same_name = ReviewerGroup.objects.filter(tenant=tenant, name=name)
    if group is not None:
        same_name = same_name.exclude(pk=group.pk)
    if same_name.exists():
        raise InputError("name_taken", f"There is already a group named {name!r}.", "name")
    secret = ""
    with transaction.atomic():
        if group is None:
            group = ReviewerGroup(tenant=tenant)
        changed: dict[str, Any] = {"name": name}
        group.name = name
        if slack is not None or slack_webhook_url == "":
            group.slack_webhook_encrypted = (
                encryption.secret_encrypt(slack, purpose=_PURPOSE) if slack else ""
            )
            changed["slack"] = "set" if slack else "removed"
        _slack_app_set(group, bot_token, channel_id, changed)
        if hook is not None or webhook_url == "":
            if hook and (not group.webhook_url or rotate_secret):
                rotate_secret = True
            group.webhook_url = hook or ""
            changed["webhook_url"] = hook or ""
            if not hook:
                group.webhook_secret_encrypted = ""
        if rotate_secret and group.webhook_url:
            secret = tokens.mint_webhook_secret()
            group.webhook_secret_encrypted = encryption.secret_encrypt(secret, purpose=_PURPOSE)
            changed["webhook_secret_rotated"] = True
        group.save()
        group.members.set(members)
        changed["members"] = members
        audit_record(
            kind=AuditKind.ROUTING_GROUP_SAVED,
            tenant=tenant,
            actor=username_of(admin),
            data={"group": group.pk, **changed},
        )
    return GroupSaved(group, secret)


def _slack_app_complete(
    group: ReviewerGroup | None, token: str | None, channel: str | None
) -> None:
    """A Slack app set or changed has both its token and its channel (posted or kept)."""
    if (token is None and channel is None) or token == "" or channel == "":
        return
    if not (token or (group is not None and group.slack_bot_token_encrypted)):
        raise InputError(
            "slack_token_required",
            "A Slack app needs its bot token as well as its channel id.",
            "slack_bot_token",
        )
    if not (channel or (group is not None and group.slack_channel_id)):
        raise InputError(
            "slack_channel_required",
            "A Slack app needs the id of the channel it posts to.",
            "slack_channel_id",
        )


@sensitive_variables("token")
def _slack_app_set(
    group: ReviewerGroup, token: str | None, channel: str | None, changed: dict[str, Any]
) -> None:
    """Store the group's Slack app (token encrypted), or remove it ("" for either); what
    changed, for the audit, says "set", "replaced" or "removed" and the channel, never the
    token."""
    if token is None and channel is None:
        return
    if token == "" or channel == "":
        if group.slack_bot_token_encrypted or group.slack_channel_id:
            changed["slack_app"] = "removed"
        group.slack_bot_token_encrypted, group.slack_channel_id = "", ""
        return
    if token:
        changed["slack_app"] = "replaced" if group.slack_bot_token_encrypted else "set"
        group.slack_bot_token_encrypted = encryption.secret_encrypt(token, purpose=_PURPOSE)
    if channel and channel != group.slack_channel_id:
        group.slack_channel_id = channel
        changed["slack_channel_id"] = channel


def _band(
    contract: ToolContract, currency: str, over: int | None, up_to: int | None
) -> tuple[str, int | None, int | None]:
    currency = (currency or "").strip().upper()
    if not currency:
        if over is not None or up_to is not None:
            raise InputError("invalid_band", "An amount band needs its currency.", "currency")
        return "", None, None
    if not (contract.quorum_amount_argument and contract.quorum_currency_argument):
        raise InputError(
            "invalid_band",
            f"{contract.name} has no amount with a currency to band by.",
            "currency",
        )
    if currency_exponent(currency) is None:
        raise InputError("invalid_band", f"{currency} is not an ISO 4217 currency.", "currency")
    if over is None and up_to is None:
        raise InputError("invalid_band", "Give the band a lower or an upper bound.", "currency")
    if any(v is not None and v < 0 for v in (over, up_to)):
        raise InputError("invalid_band", "Amounts are 0 or more (minor units).", "amount")
    if over is not None and up_to is not None and up_to <= over:
        raise InputError("invalid_band", "The upper bound must be above the lower.", "amount")
    return currency, over, up_to


def _describe(version: RoutingRuleVersion | None) -> dict[str, Any] | None:
    if version is None:
        return None
    return {
        "version": version.version,
        "active": version.is_active,
        "groups": sorted(version.groups.values_list("name", flat=True)),
        "fallback": version.fallback_group.name if version.fallback_group else None,
        "currency": version.currency,
        "amount_over_minor": version.amount_over_minor,
        "amount_up_to_minor": version.amount_up_to_minor,
    }


def _new_version(
    *,
    rule: RoutingRule,
    admin: User,
    active: bool,
    groups: list[ReviewerGroup],
    fallback: ReviewerGroup | None,
    band: tuple[str, int | None, int | None],
) -> tuple[RoutingRuleVersion, dict[str, Any]]:
    """The rule's next version (the current one retired) and what changed, for the audit
    event the caller writes."""
    previous = (
        RoutingRuleVersion.objects.select_for_update(of=("self",))
        .filter(rule=rule, is_current=True)
        .select_related("fallback_group")
        .first()
    )
    before = _describe(previous)
    if previous is not None:
        RoutingRuleVersion.objects.filter(pk=previous.pk).update(is_current=False)
    currency, over, up_to = band
    version = RoutingRuleVersion.objects.create(
        rule=rule,
        version=(previous.version + 1) if previous else 1,
        is_active=active,
        fallback_group=fallback,
        currency=currency,
        amount_over_minor=over,
        amount_up_to_minor=up_to,
        tenant_id=rule.tenant_id,
        tool_id=rule.tool_id,
        created_by_id=admin.pk,
    )
    version.groups.set(groups)
    return version, {
        "rule": rule.pk,
        "name": rule.name,
        "tool": rule.tool.name,
        "before": before,
        "after": _describe(version),
    }


def routing_rule_save(
    *,
    tenant: Tenant,
    admin: User,
    tool: str,
    name: str,
    group_ids: list[int],
    fallback_group_id: int | None = None,
    currency: str = "",
    amount_over_minor: int | None = None,
    amount_up_to_minor: int | None = None,
) -> RoutingRuleVersion:
    """Write a new version of the tenant's rule ``name`` for ``tool`` (creating the rule on
    its first version), audited ``routing.rule_saved`` with the versions before and after."""
    require_role(admin, tenant.pk, Membership.Role.ADMIN)
    name = _name(name, "rule")
    contract = ToolContract.objects.filter(name=tool).first()
    if contract is None:
        raise InputError("unknown_tool", f"There is no tool contract named {tool!r}.", "tool")
    band = _band(contract, currency, amount_over_minor, amount_up_to_minor)
    groups = list(ReviewerGroup.objects.filter(tenant=tenant, pk__in=set(group_ids)))
    if not groups or len(groups) != len(set(group_ids)):
        raise InputError("invalid_group", "Choose one or more groups of this tenant.", "groups")
    fallback = None
    if fallback_group_id is not None:
        fallback = ReviewerGroup.objects.filter(tenant=tenant, pk=fallback_group_id).first()
        if fallback is None:
            raise InputError("invalid_group", "No such fallback group.", "fallback_group")
    with transaction.atomic():
        rule, _ = RoutingRule.objects.get_or_create(tenant=tenant, tool=contract, name=name)
        rule = (
            RoutingRule.objects.select_for_update(of=("self",))
            .select_related("tool")
            .get(pk=rule.pk)
        )
        version, change = _new_version(
            rule=rule, admin=admin, active=True, groups=groups, fallback=fallback, band=band
        )
        audit_record(
            kind=AuditKind.ROUTING_RULE_SAVED,
            tenant=tenant,
            actor=username_of(admin),
            data=change,
        )
    return version


def routing_rule_remove(*, tenant: Tenant, admin: User, rule_id: int) -> bool:
    """Retire a rule: a new, inactive version (the earlier ones stay, for the requests they
    routed), audited ``routing.rule_removed``. False if it was not active."""
    with transaction.atomic():
        rule = (
            RoutingRule.objects.select_for_update(of=("self",))
            .select_related("tool")
            .filter(tenant=tenant, pk=rule_id)
            .first()
        )
        if rule is None:
            return False
        if not rule.versions.filter(is_current=True, is_active=True).exists():
            return False
        _, change = _new_version(
            rule=rule, admin=admin, active=False, groups=[], fallback=None, band=("", None, None)
        )
        audit_record(
            kind=AuditKind.ROUTING_RULE_REMOVED,
            tenant=tenant,
            actor=username_of(admin),
            data=change,
        )
    return True
