"""Who may see what in the console: the signed-in user's tenants and roles, and a tenant's
members."""

from __future__ import annotations

from typing import Any

from approvals.compiled import Compiled, Param
from approvals.models import (
    Membership,
    Tenant,
)

# Roles that may open the console: reviewers decide, admins revoke.
CONSOLE_ROLES = (Membership.Role.REVIEWER, Membership.Role.ADMIN)


class ConsoleAccess:
    """A user's console roles by tenant, read once per request."""

    def __init__(self, memberships: list[Membership]) -> None:
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


def console_access(user: Any) -> ConsoleAccess:
    return ConsoleAccess(console_memberships(user))


_MEMBERSHIPS = Compiled[Membership](
    lambda: (
        Membership.objects.filter(user_id=Param("user", Membership._meta.get_field("user")))
        .select_related("tenant")
        .order_by("tenant__name", "tenant__slug", "role")
    )
)


def console_memberships(user: Any) -> list[Membership]:
    """The user's memberships with their tenants, in one query (read on every page)."""
    if not user.is_authenticated:
        return []
    return _MEMBERSHIPS.run(user=user.pk)


_TENANT_PK = Tenant._meta.pk


_REVIEWER_NAMES = Compiled[str](
    lambda: (
        Membership.objects.filter(
            tenant_id=Param("tenant", _TENANT_PK), role=Membership.Role.REVIEWER
        )
        .order_by("user__username")
        .values_list("user__username", flat=True)
    )
)


_MEMBERS = Compiled[tuple[str, str]](
    lambda: (
        Membership.objects.filter(tenant_id=Param("tenant", _TENANT_PK))
        .values_list("user__username", "user__email")
        .distinct()
    )
)


def tenant_reviewer_names(tenant_id: int) -> list[str]:
    return _REVIEWER_NAMES.run(tenant=tenant_id)


def tenant_members(tenant_id: int) -> list[tuple[str, str]]:
    """The (username, email) of everyone with a role in the tenant."""
    return _MEMBERS.run(tenant=tenant_id)
