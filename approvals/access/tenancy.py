"""Tenants and roles: who is what in which tenant."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from approvals.errors import ErrorCode, ServiceError
from approvals.models import (
    Membership,
    Tenant,
)
from approvals.sql import fetch, on_postgresql

User = AbstractBaseUser | AnonymousUser


def has_role(user: User, tenant_id: int, role: str) -> bool:
    if not user.is_authenticated:
        return False
    return Membership.objects.filter(user_id=user.pk, tenant_id=tenant_id, role=role).exists()


def require_role(user: User, tenant_id: int, role: str) -> None:
    if not has_role(user, tenant_id, role):
        raise ServiceError(ErrorCode.FORBIDDEN, f"You are not a {role} of this tenant.", 403)


def username_of(user: User) -> str:
    return str(user.get_username())


def tenant_create(*, slug: str, name: str = "") -> Tenant:
    return Tenant.objects.create(slug=slug, name=name or slug)


_MEMBERS_SQL = f"""
SELECT DISTINCT u.username, u.email
  FROM {Membership._meta.db_table} m
  JOIN {get_user_model()._meta.db_table} u ON u.id = m.user_id
 WHERE m.tenant_id = %s"""  # noqa: S608 (no input in the text)


def tenant_members(tenant_id: int) -> list[tuple[str, str]]:
    """The (username, email) of everyone with a role in the tenant: whom an
    agent-supplied requester may name (the review page, the notifications)."""
    if on_postgresql():
        return [(name, email) for name, email in fetch(_MEMBERS_SQL, [tenant_id])]
    return list(
        Membership.objects.filter(tenant_id=tenant_id)
        .values_list("user__username", "user__email")
        .distinct()
    )
