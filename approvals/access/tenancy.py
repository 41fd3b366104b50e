"""Tenants and roles: who is what in which tenant."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from approvals.errors import ErrorCode, ServiceError
from approvals.models import (
    Membership,
    Tenant,
)

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
