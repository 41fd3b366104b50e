"""Routing in the console's words: a rule version's band and who it asks."""

from __future__ import annotations

from dataclasses import dataclass

from approvals.models import RoutingRuleVersion
from approvals.web.money import format_money


def band_text(version: RoutingRuleVersion) -> str:
    """ "EUR above 500.00", "EUR above 100.00 up to 500.00", or "every request"."""
    if not version.currency:
        return "every request"

    def money(value: int) -> str:
        try:
            return format_money(value, version.currency)
        except ValueError:
            return f"{version.currency} {value}"

    low, high = version.amount_over_minor, version.amount_up_to_minor
    parts = []
    if low is not None:
        parts.append(f"above {money(low)}")
    if high is not None:
        parts.append(f"up to {money(high)}")
    return " ".join(parts)


@dataclass(frozen=True)
class RoutedBy:
    """What the review page says of a request's routing."""

    rule: str
    version: int
    band: str
    groups: list[str]
    fallback: str
    current: bool  # the rule has not changed since


def routed_by(version_id: int | None) -> RoutedBy | None:
    if version_id is None:
        return None
    version = (
        RoutingRuleVersion.objects.select_related("rule", "fallback_group")
        .prefetch_related("groups")
        .filter(pk=version_id)
        .first()
    )
    if version is None:
        return None
    return RoutedBy(
        rule=version.rule.name,
        version=version.version,
        band=band_text(version),
        groups=sorted(g.name for g in version.groups.all()),
        fallback=version.fallback_group.name if version.fallback_group else "",
        current=version.is_current,
    )
