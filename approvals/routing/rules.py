"""Which rule version routes a request, and to whom it is routed."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import (
    BigIntegerField,
    Case,
    F,
    IntegerField,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.expressions import RawSQL

from approvals.models import Membership, ReviewerGroup, RoutingRuleVersion, ToolContract


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


def routing_versions(*, tenant_id: int, contract: ToolContract, arguments: Any) -> QuerySet[Any]:
    """The current rule versions that may route this request, the one that routes it first:
    a rule whose band holds the amount comes before a rule without a band, the narrower
    band (the higher floor) first. ``routing_version``'s ORM twin: the SQL runs on both
    databases, this is the reading ``tests/approvals/test_hot_path_sql.py`` holds it equal to."""
    match = Q(currency="")
    money = request_money(contract, arguments)
    if money is not None:
        amount, currency = money
        match |= (
            Q(currency=currency)
            & (Q(amount_over_minor__isnull=True) | Q(amount_over_minor__lt=amount))
            & (Q(amount_up_to_minor__isnull=True) | Q(amount_up_to_minor__gte=amount))
        )
    return (
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


# ``routing_versions``' first id, written as SQL: Django compiled the queryset's subquery
# on every proposal, at 1.5 ms of CPU, five times the INSERT it sits in (issue 28). The
# text runs on PostgreSQL and SQLite alike (both read NULLS LAST and a boolean column).
_ROUTING_SQL = """SELECT v.id FROM {table} v
 WHERE v.is_active AND v.is_current AND v.tenant_id = %s AND v.tool_id = %s
   AND (v.currency = ''{banded})
 ORDER BY CASE WHEN v.currency = '' THEN 1 ELSE 0 END, v.amount_over_minor DESC NULLS LAST,
          v.rule_id
 LIMIT 1"""
_BANDED = """ OR (v.currency = %s
        AND (v.amount_over_minor IS NULL OR v.amount_over_minor < %s)
        AND (v.amount_up_to_minor IS NULL OR v.amount_up_to_minor >= %s))"""
_ROUTING = {
    banded: " ".join(
        _ROUTING_SQL.format(
            table=RoutingRuleVersion._meta.db_table, banded=_BANDED if banded else ""
        ).split()
    )
    for banded in (False, True)
}


def routing_version(*, tenant_id: int, contract: ToolContract, arguments: Any) -> RawSQL:
    """The current rule version that routes this request (``routing_versions``' first), as
    a subquery for the proposal's INSERT (no query of its own); null when none matches."""
    money = request_money(contract, arguments)
    if money is None:
        return RawSQL(  # noqa: S611 (no input in the text)
            _ROUTING[False], (tenant_id, contract.pk), output_field=BigIntegerField()
        )
    amount, currency = money
    return RawSQL(  # noqa: S611 (no input in the text)
        _ROUTING[True],
        (tenant_id, contract.pk, currency, amount, amount),
        output_field=BigIntegerField(),
    )


def audience(
    *, tenant_id: int, group_ids: list[int] | None, role: str = Membership.Role.REVIEWER
) -> list[Any]:
    """The active users told of a request personally, in one query: the members of
    ``group_ids`` (the groups a rule routed it to), or, when no rule routed it (None),
    everyone in the tenant with ``role`` (who reviews; the admins for an escalation with
    no fallback group)."""
    users = get_user_model().objects.filter(is_active=True)
    if group_ids is None:
        users = users.filter(memberships__tenant_id=tenant_id, memberships__role=role)
    else:
        # A subquery rather than a join, so that a member of two groups needs no DISTINCT.
        members = ReviewerGroup.members.through.objects.filter(reviewergroup_id__in=group_ids)
        return list(users.filter(pk__in=members.values("user_id")).order_by("pk"))
    return list(users.distinct().order_by("pk"))
