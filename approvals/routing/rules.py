"""Which rule version routes a request, and to whom it is routed."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import (
    BigIntegerField,
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


# The rule version that routes a request, written as SQL: Django compiled a queryset's
# subquery on every proposal, at 1.5 ms of CPU, five times the INSERT it sits in (issue 28).
# The text runs on PostgreSQL and SQLite alike (both read NULLS LAST and a boolean column),
# so it has no ORM twin: tests/approvals/test_hot_path_sql.py holds it to the rule written
# as a queryset there, and runs the text on SQLite too.
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
    """The current rule version that routes this request, as a subquery for the proposal's
    INSERT (no query of its own); null when none matches. Of the current, active versions
    of the tenant's rules for the tool, a rule whose band (currency, above and/or up to an
    amount) holds the request's money comes before a rule without a band, the narrower band
    (the higher floor) first, then the rule's id."""
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
