"""Which rule version routes a request, and to whom it is routed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Case, F, IntegerField, Q, Subquery, Value, When

from approvals.models import (
    Membership,
    ReviewerGroup,
    RoutingRuleVersion,
    ToolContract,
)


def request_money(contract: ToolContract, arguments: Any) -> tuple[int, str] | None:
    """The request's amount and currency, as the contract names them (its quorum's
    arguments), or None when it has no money to band by."""
    if not isinstance(arguments, dict) or not contract.quorum_amount_argument:
        return None
    amount = arguments.get(contract.quorum_amount_argument)
    currency = arguments.get(contract.quorum_currency_argument or "")
    if not isinstance(amount, int) or isinstance(amount, bool) or not isinstance(currency, str):
        return None
    return amount, currency


def routing_version(*, tenant_id: int, contract: ToolContract, arguments: Any) -> Subquery:
    """The current rule version that routes this request, as a subquery for the proposal's
    INSERT (no query of its own): a rule whose band holds the amount comes before a rule
    without a band, the narrower band (the higher floor) first; null when none matches."""
    match = Q(currency="")
    money = request_money(contract, arguments)
    if money is not None:
        amount, currency = money
        match |= (
            Q(currency=currency)
            & (Q(amount_over_minor__isnull=True) | Q(amount_over_minor__lt=amount))
            & (Q(amount_up_to_minor__isnull=True) | Q(amount_up_to_minor__gte=amount))
        )
    versions = (
        RoutingRuleVersion.objects.filter(
            tenant_id=tenant_id, tool_id=contract.pk, is_current=True, is_active=True
        )
        .filter(match)
        .annotate(
            unbanded=Case(
                When(currency="", then=Value(1)), default=Value(0), output_field=IntegerField()
            )
        )
        .order_by("unbanded", F("amount_over_minor").desc(nulls_last=True), "rule_id")
    )
    return Subquery(versions.values("pk")[:1])


@dataclass(frozen=True)
class Routed:
    """Who a request is routed to: its rule version (None: no rule matched), the groups
    asked, and the fallback group (told on escalation)."""

    version: RoutingRuleVersion | None
    groups: list[ReviewerGroup]
    fallback: ReviewerGroup | None


def routed(version_id: int | None) -> Routed:
    if version_id is None:
        return Routed(None, [], None)
    version = RoutingRuleVersion.objects.select_related("rule", "fallback_group").get(pk=version_id)
    return Routed(version, list(version.groups.order_by("name")), version.fallback_group)


def tenant_reviewer_ids(tenant_id: int) -> list[int]:
    """Everyone who reviews in the tenant: told of a request no rule routed."""
    return list(
        Membership.objects.filter(tenant_id=tenant_id, role=Membership.Role.REVIEWER)
        .values_list("user_id", flat=True)
        .distinct()
    )
