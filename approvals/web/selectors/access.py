"""Who may see what in the console: the signed-in user's tenants and roles, and a tenant's
members."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from approvals.models import (
    Membership,
    Tenant,
)
from approvals.notifications.selectors import UNREAD_COUNT_SQL, unread_count_subquery
from approvals.sql import Columns, fetch, on_postgresql, split

# Roles that may open the console: reviewers decide, admins revoke.
CONSOLE_ROLES = (Membership.Role.REVIEWER, Membership.Role.ADMIN)


class ConsoleAccess:
    """A user's console roles by tenant, read once per request, and the header's count of
    their unread notifications, read with them."""

    def __init__(self, memberships: list[Membership]) -> None:
        # Every membership row carries the same count (``console_memberships``). Without a
        # role the header shows no notifications link, so none is counted.
        self.unread: int = getattr(memberships[0], "unread", 0) if memberships else 0
        self.roles: dict[int, set[str]] = {}
        self.tenants: list[Tenant] = []
        # Operators work in the operations console; the header links to it.
        self.operator_tenant_ids: set[int] = set()
        self.operator_tenants: list[Tenant] = []  # in name order, as the console's
        for membership in memberships:
            if membership.role == Membership.Role.OPERATOR:
                if membership.tenant_id not in self.operator_tenant_ids:
                    self.operator_tenant_ids.add(membership.tenant_id)
                    self.operator_tenants.append(membership.tenant)
                continue
            if membership.tenant_id not in self.roles:
                self.roles[membership.tenant_id] = set()
                self.tenants.append(membership.tenant)
            self.roles[membership.tenant_id].add(membership.role)

    @property
    def tenant_ids(self) -> list[int]:
        return list(self.roles)

    def is_reviewer(self, tenant_id: int) -> bool:
        return Membership.Role.REVIEWER in self.roles.get(tenant_id, set())

    def is_admin(self, tenant_id: int) -> bool:
        return Membership.Role.ADMIN in self.roles.get(tenant_id, set())

    def notifications_read(self, marked: int) -> None:
        """The page just marked ``marked`` of the user's notifications read (after the count
        was read): its header counts them no more."""
        self.unread = max(0, self.unread - marked)


def console_access(user: Any) -> ConsoleAccess:
    return ConsoleAccess(console_memberships(user))


_MEMBERSHIP = Columns(Membership, "m")
_TENANT = Columns(Tenant, "t")

_MEMBERSHIPS_SQL = f"""
SELECT {_MEMBERSHIP.sql}, {_TENANT.sql}, {UNREAD_COUNT_SQL}
  FROM approvals_membership m
  JOIN approvals_tenant t ON t.id = m.tenant_id
 WHERE m.user_id = %s
 ORDER BY t.name, t.slug, m.role"""  # noqa: S608 (no input in the text)


def _memberships_queryset(user_id: int) -> QuerySet[Membership]:
    """The ORM twin of ``_MEMBERSHIPS_SQL``."""
    return (
        Membership.objects.filter(user_id=user_id)
        .select_related("tenant")
        .annotate(unread=unread_count_subquery(user_id))
        .order_by("tenant__name", "tenant__slug", "role")
    )


def console_memberships(user: Any) -> list[Membership]:
    """The user's memberships with their tenants, in one query (read on every page); each
    carries the user's unread notifications' count as ``unread``, the header's."""
    if not user.is_authenticated:
        return []
    if not on_postgresql():
        return list(_memberships_queryset(user.pk))
    memberships = []
    for row in fetch(_MEMBERSHIPS_SQL, [user.pk, user.pk]):
        membership, membership.tenant, membership.unread = split(row, _MEMBERSHIP, _TENANT, 1)
        memberships.append(membership)
    return memberships


_REVIEWER_NAMES_SQL = """
SELECT u.username
  FROM approvals_membership m
  JOIN auth_user u ON u.id = m.user_id
 WHERE m.tenant_id = %s AND m.role = %s
 ORDER BY u.username"""


def tenant_reviewer_names(tenant_id: int) -> list[str]:
    if on_postgresql():
        return [name for (name,) in fetch(_REVIEWER_NAMES_SQL, [tenant_id, _REVIEWER])]
    return list(
        Membership.objects.filter(tenant_id=tenant_id, role=_REVIEWER)
        .order_by("user__username")
        .values_list("user__username", flat=True)
    )


_REVIEWER = Membership.Role.REVIEWER.value
