"""Reads compiled once per process (``approvals.compiled``) answer as their querysets do:
the same rows, related objects, annotations and prefetches, each call with its own values,
on the connection of the thread that runs it."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from django.db import connection, connections
from django.db.models import BigIntegerField, CharField
from django.test.utils import CaptureQueriesContext

from approvals.compiled import Compiled, Param, ParamArray, ParamList
from approvals.models import Membership, Occurrence, Tenant
from approvals.web.selectors.access import console_memberships
from approvals.web.selectors.review import review_get, review_queryset
from tests.conftest import Runtime, approve, make_runtime, make_user

pytestmark = pytest.mark.django_db


def _fields(occurrence: Occurrence) -> dict[str, Any]:
    """What a review page reads of an occurrence: its columns, annotations, related rows."""
    annotated: Any = occurrence
    return {
        **{f.attname: getattr(occurrence, f.attname) for f in Occurrence._meta.concrete_fields},
        "annotations": {
            name: getattr(annotated, name)
            for name in ("fresh_event_id", "fresh_approval_state", "history_total")
        },
        "tool": occurrence.tool.name,
        "tenant": occurrence.tenant.slug,
        "runtime_key": occurrence.runtime_key.name if occurrence.runtime_key else None,
        "proposals": [
            (p.pk, p.action_digest, [v.reviewer.username for v in p.votes.all()])
            for p in occurrence.proposals.all()
        ],
        "approvals": [
            (a.pk, a.state, a.approver.username, getattr(a, "command", None))
            for a in occurrence.approvals.all()
        ],
    }


def test_the_review_read_answers_as_its_queryset(
    runtime: Runtime, reviewer: Any, approved: str, token: str, other_tenant: Tenant
) -> None:
    assert runtime.claim(token, "exec-1").status_code == 200
    pending = uuid.UUID(runtime.propose(run_id="run-2").json()["occurrence_id"])
    other = uuid.UUID(make_runtime(other_tenant, "theirs").propose().json()["occurrence_id"])
    mine = runtime.key.tenant_id
    for occurrence_id in (uuid.UUID(approved), pending):
        for tenant_ids in ([mine], [other_tenant.pk, mine]):
            compiled = review_get(occurrence_id=occurrence_id, tenant_ids=tenant_ids)
            plain = review_queryset().filter(pk=occurrence_id, tenant_id__in=tenant_ids).first()
            assert compiled is not None and plain is not None
            assert _fields(compiled) == _fields(plain)
    # What the page reads of it is read with it: no query more.
    read = review_get(occurrence_id=uuid.UUID(approved), tenant_ids=[mine])
    assert read is not None
    with CaptureQueriesContext(connection) as later:
        _fields(read)
        assert all(p.occurrence is read for p in read.proposals.all())
        assert all(v.proposal.pk == p.pk for p in read.proposals.all() for v in p.votes.all())
        assert all(a.occurrence is read for a in read.approvals.all())
    assert later.captured_queries == []
    # Another tenant's occurrence is none of these tenants'.
    assert review_get(occurrence_id=other, tenant_ids=[mine]) is None
    assert review_get(occurrence_id=uuid.UUID(approved), tenant_ids=[]) is None


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


@pytest.mark.django_db(transaction=True)
def test_a_read_compiled_in_one_thread_runs_on_another_threads_connection(
    runtime: Runtime, reviewer: Any
) -> None:
    """A served worker's threads each have their own connection; the compiled statement is
    shared, the connection it runs on is the caller's."""
    occurrence_id = uuid.UUID(runtime.propose().json()["occurrence_id"])
    approve(str(occurrence_id), reviewer)
    mine = runtime.key.tenant_id
    assert review_get(occurrence_id=occurrence_id, tenant_ids=[mine]) is not None
    seen: dict[str, Any] = {}

    def other_thread() -> None:
        try:
            found = review_get(occurrence_id=occurrence_id, tenant_ids=[mine])
            seen["found"] = found and found.pk
            seen["connection"] = connections["default"]
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert str(seen["found"]) == str(occurrence_id)
    assert seen["connection"] is not connection


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
