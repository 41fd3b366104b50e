"""Reads compiled once per process (``approvals.compiled``) answer as their querysets do:
the same rows, related objects, annotations and prefetches, each call with its own values,
on the connection of the thread that runs it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import BigIntegerField, CharField
from django.test.utils import CaptureQueriesContext

from approvals.compiled import Compiled, Param, ParamArray, ParamList
from approvals.models import Membership, Tenant
from approvals.web.selectors.access import console_memberships
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


def test_each_call_binds_its_own_values_and_each_list_length_compiles_once(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    make_user("una", tenant, Membership.Role.REVIEWER)
    make_user("olga", other_tenant, Membership.Role.OPERATOR)
    slugs = Compiled[str](
        lambda tenants: (
            Tenant.objects.filter(pk__in=ParamList("tenants", tenants, BigIntegerField()))
            .order_by("slug")
            .values_list("slug", flat=True)
        )
    )
    assert slugs.run(tenants=[tenant.pk]) == ["acme"]
    assert slugs.run(tenants=[other_tenant.pk]) == ["globex"]
    assert slugs.run(tenants=[other_tenant.pk, tenant.pk]) == ["acme", "globex"]
    assert len(list(slugs.compiled())) == 2  # one list length, then another
    for sql in slugs.compiled():
        assert str(tenant.pk) not in sql and "globex" not in sql  # values are parameters

    named = Compiled[Membership](
        lambda: Membership.objects.filter(user__username=Param("name", CharField()))
    )
    with CaptureQueriesContext(connection) as queries:
        assert [m.role for m in named.run(name="una")] == [Membership.Role.REVIEWER]
        assert [m.role for m in named.run(name="olga")] == [Membership.Role.OPERATOR]
        assert named.run(name="nobody") == []
    assert len(queries) == 3


def test_a_list_of_ids_is_one_parameter_whatever_its_length(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    slugs = Compiled[str](
        lambda: (
            Tenant.objects.filter(pk__in=ParamArray("ids"))
            .order_by("slug")
            .values_list("slug", flat=True)
        )
    )
    assert slugs.run(ids=[tenant.pk]) == ["acme"]
    assert slugs.run(ids=[other_tenant.pk, tenant.pk, 10**12]) == ["acme", "globex"]
    assert slugs.run(ids=[]) == []
    [sql] = slugs.compiled()
    assert sql.count("%s") == 1


def test_an_empty_list_is_refused_when_the_statement_is_built() -> None:
    with pytest.raises(ValueError, match="empty list"):
        ParamList("tenants", 0, BigIntegerField())


def test_a_users_memberships_are_read_as_before(
    tenant: Tenant, other_tenant: Tenant, reviewer: Any
) -> None:
    Membership.objects.create(user=reviewer, tenant=other_tenant, role=Membership.Role.ADMIN)
    Membership.objects.create(user=reviewer, tenant=tenant, role=Membership.Role.OPERATOR)
    compiled = console_memberships(reviewer)
    plain = list(
        Membership.objects.filter(user_id=reviewer.pk)
        .select_related("tenant")
        .order_by("tenant__name", "tenant__slug", "role")
    )
    assert [(m.pk, m.tenant.name, m.role) for m in compiled] == [
        (m.pk, m.tenant.name, m.role) for m in plain
    ]
    assert len(compiled) == 3
