"""The pages' reads in plain SQL (PostgreSQL) answer as their ORM twins do (what SQLite
runs): the same rows, related objects, annotations and lists, for each set of values."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from approvals.models import AuditEvent, Occurrence, Tenant
from approvals.web.selectors import review as review_reads
from approvals.web.selectors.review import Reviewed, review_get
from tests.conftest import REFUND_ARGS, Runtime, make_runtime

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the SQL reads run on PostgreSQL only; SQLite runs their ORM twins")


def _row(instance: Any) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def _reviewed(reviewed: Reviewed) -> dict[str, Any]:
    """What a review page reads of an occurrence: its columns, freshness, related rows."""
    occurrence = reviewed.occurrence
    return {
        "occurrence": _row(occurrence),
        "tool": _row(occurrence.tool),
        "tenant": _row(occurrence.tenant),
        "runtime_key": _row(occurrence.runtime_key) if occurrence.runtime_key else None,
        "freshness": reviewed.freshness,
        "history_total": reviewed.history_total,
        "proposals": [
            (_row(p), p.edited_by.username if p.edited_by else None) for p in reviewed.proposals
        ],
        "votes": {
            pk: [(_row(v), v.reviewer.username) for v in votes]
            for pk, votes in reviewed.votes.items()
        },
        "approvals": [(_row(a), a.approver.username) for a in reviewed.approvals],
        "commands": {pk: _row(c) for pk, c in reviewed.commands.items()},
    }


def _twin(occurrence_id: uuid.UUID, tenant_ids: list[int]) -> Reviewed | None:
    found = review_reads.review_queryset().filter(pk=occurrence_id, tenant_id__in=tenant_ids)
    return review_reads._reviewed_of(found.first())


def test_the_review_read_answers_as_its_orm_twin(
    runtime: Runtime,
    reviewer: Any,
    second_reviewer: Any,
    approved: str,
    token: str,
    other_tenant: Tenant,
) -> None:
    assert runtime.claim(token, "exec-1").status_code == 200
    pending = uuid.UUID(runtime.propose(run_id="run-2").json()["occurrence_id"])
    other = uuid.UUID(make_runtime(other_tenant, "theirs").propose().json()["occurrence_id"])
    mine = runtime.key.tenant_id
    for occurrence_id in (uuid.UUID(approved), pending):
        for tenant_ids in ([mine], [other_tenant.pk, mine]):
            read = review_get(occurrence_id=occurrence_id, tenant_ids=tenant_ids)
            twin = _twin(occurrence_id, tenant_ids)
            assert read is not None and twin is not None
            assert _reviewed(read) == _reviewed(twin)
    assert review_get(occurrence_id=other, tenant_ids=[mine]) is None
    assert review_get(occurrence_id=other, tenant_ids=[]) is None
    freshness = review_reads.freshness_get(occurrence_id=pending, tenant_ids=[mine])
    twin_freshness = review_reads.Freshness.of(review_reads._freshness_queryset().get(pk=pending))
    assert freshness == twin_freshness
    assert review_reads.freshness_get(occurrence_id=other, tenant_ids=[mine]) is None


def test_a_tenant_without_reviewers_reads_none_as_its_twin_does(runtime: Runtime) -> None:
    pending = uuid.UUID(runtime.propose().json()["occurrence_id"])
    occurrence = Occurrence.objects.get(pk=pending)
    read = review_get(occurrence_id=pending, tenant_ids=[occurrence.tenant_id])
    twin = _twin(pending, [occurrence.tenant_id])
    assert read is not None and twin is not None
    assert read.freshness.reviewers == twin.freshness.reviewers == (None, None)
    assert _reviewed(read) == _reviewed(twin)


def test_the_history_windows_answer_as_their_orm_twins(
    runtime: Runtime, reviewer: Any, approved: str
) -> None:
    from approvals.web.selectors import history

    occurrence_id = uuid.UUID(approved)
    ids = list(
        AuditEvent.objects.filter(occurrence_id=occurrence_id)
        .order_by("id")
        .values_list("id", flat=True)
    )
    assert len(ids) >= 3
    for name, event_id in [
        ("newest", None),
        ("before", ids[-1]),
        ("before", ids[1]),
        ("after", 0),
        ("after", ids[0]),
        ("after", ids[-1]),
    ]:
        for size in (1, 2, 50):
            read = history._window(occurrence_id, name, event_id, size)
            twin = list(history._window_queryset(occurrence_id, name, event_id)[:size])
            assert [_row(e) for e in read] == [_row(e) for e in twin], (name, event_id, size)
    for event_id in ids:
        expected = AuditEvent.objects.filter(occurrence_id=occurrence_id, id__lt=event_id)
        assert history._earlier(occurrence_id, event_id) == expected.count()
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    assert history.rejected_by(occurrence) == ""
    rejected = uuid.UUID(runtime.propose(run_id="run-r").json()["occurrence_id"])
    assert runtime.get(f"/api/v1/occurrences/{rejected}").status_code == 200
    from approvals.reviews.decisions import occurrence_reject

    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=rejected), reviewer=reviewer, reason="no"
    )
    assert history.rejected_by(Occurrence.objects.get(pk=rejected)) == reviewer.username


def test_the_inbox_reads_answer_as_their_orm_twins(
    runtime: Runtime, reviewer: Any, approved: str, other_tenant: Tenant
) -> None:
    from approvals.models import ToolContract
    from approvals.reviews.selectors import inbox_tools, tool_ids
    from approvals.sql import on_postgresql
    from approvals.web.selectors import inbox
    from approvals.web.selectors.inbox import InboxQuery

    for n in range(4):
        runtime.propose(run_id=f"run-{n}")
    runtime.propose(
        run_id="run-yen", arguments={**REFUND_ARGS, "amount_minor": 900, "currency": "JPY"}
    )
    runtime.propose(
        run_id="run-kwd", arguments={**REFUND_ARGS, "amount_minor": 90500, "currency": "KWD"}
    )
    make_runtime(other_tenant, "theirs").propose()
    mine = runtime.key.tenant_id
    refund = ToolContract.objects.get(name="issue_refund").pk
    queries = [
        InboxQuery([mine]),
        InboxQuery([mine, other_tenant.pk]),
        InboxQuery([mine], tool_id=refund),
        InboxQuery([mine], status=Occurrence.Status.PENDING_REVIEW),
        InboxQuery([mine], tool_id=refund, status=Occurrence.Status.APPROVED),
        InboxQuery([]),
        # The requester, run and amount filters (bulk review's selection).
        InboxQuery([mine], run_id="run-yen"),
        InboxQuery([mine], requested_by="nobody"),
        InboxQuery([mine], amount_min=Decimal("80")),
        InboxQuery([mine], amount_min=Decimal("80.01")),
        InboxQuery([mine], amount_max=Decimal("90.5")),
        InboxQuery([mine], amount_min=Decimal("1"), amount_max=Decimal("900")),
    ]

    def twin(read: Any) -> Any:
        """``read`` run as SQLite runs it: the ORM twins."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(inbox, "on_postgresql", lambda: False)
            return read()

    assert on_postgresql()
    for query in queries:
        assert inbox.inbox_total(query) == twin(lambda q=query: inbox.inbox_total(q))
        for offset, limit in ((0, 2), (2, 2), (0, 25), (10, 5)):
            assert inbox.inbox_last_event(query, offset=offset, limit=limit) == twin(
                lambda q=query, o=offset, n=limit: inbox.inbox_last_event(q, offset=o, limit=n)
            )
            read = inbox._page_rows(query, offset, limit)
            orm = twin(lambda q=query, o=offset, n=limit: inbox._page_rows(q, o, n))
            assert [_row(o) for o in read[0]] == [_row(o) for o in orm[0]]
            key = lambda p: p.pk  # noqa: E731
            assert [
                (_row(p), getattr(p, "votes_count", None)) for p in sorted(read[1], key=key)
            ] == [(_row(p), getattr(p, "votes_count", None)) for p in sorted(orm[1], key=key)]
            assert sorted(_row(a).items() for a in read[2]) == sorted(
                _row(a).items() for a in orm[2]
            )
    # EUR 80.00 (5 of them, one approved), JPY 900, KWD 90.500: the range reads each in
    # its own currency's major units.
    assert inbox.inbox_total(InboxQuery([mine], amount_min=Decimal("80"))).total == 7
    assert inbox.inbox_total(InboxQuery([mine], amount_min=Decimal("80.01"))).total == 2
    assert inbox.inbox_total(InboxQuery([mine], amount_max=Decimal("90.5"))).total == 6
    contracts = inbox_tools()
    assert [_row(t) for t in contracts.values()] == [
        _row(t) for t in ToolContract.objects.defer("json_schema", "description").order_by("name")
    ]
    assert tool_ids() == dict(ToolContract.objects.order_by("name").values_list("name", "id"))


def test_a_users_memberships_are_read_as_their_orm_twin(
    tenant: Tenant, other_tenant: Tenant, reviewer: Any
) -> None:
    from approvals.access import tenancy
    from approvals.models import Membership
    from approvals.web.selectors import access

    Membership.objects.create(user=reviewer, tenant=other_tenant, role=Membership.Role.ADMIN)
    Membership.objects.create(user=reviewer, tenant=tenant, role=Membership.Role.OPERATOR)
    read = access.console_memberships(reviewer)
    twin = list(access._memberships_queryset(reviewer.pk))
    assert [(_row(m), _row(m.tenant)) for m in read] == [(_row(m), _row(m.tenant)) for m in twin]
    assert len(read) == 3
    assert access.tenant_reviewer_names(tenant.pk) == [reviewer.username]
    assert tenancy.tenant_members(tenant.pk) == [(reviewer.username, reviewer.email)]


def test_the_tenant_members_sql_names_its_tables_from_the_models(
    monkeypatch: pytest.MonkeyPatch, tenant: Tenant, other_tenant: Tenant, reviewer: Any
) -> None:
    import importlib

    from django.contrib.auth import get_user_model

    from approvals.access import tenancy
    from approvals.models import Membership

    # A reviewer in two roles is listed once; another tenant's member is not listed.
    Membership.objects.create(user=reviewer, tenant=tenant, role=Membership.Role.ADMIN)
    stranger = get_user_model().objects.create_user(username="gina", email="g@x.test")
    Membership.objects.create(user=stranger, tenant=other_tenant, role="admin")
    assert tenancy.tenant_members(tenant.pk) == [(reviewer.username, reviewer.email)]

    # The SQL is written with the models' table names, not copies of them.
    monkeypatch.setattr(Membership._meta, "db_table", "renamed_membership")
    monkeypatch.setattr(get_user_model()._meta, "db_table", "renamed_user")
    try:
        importlib.reload(tenancy)
        assert "FROM renamed_membership m" in tenancy._MEMBERS_SQL
        assert "JOIN renamed_user u" in tenancy._MEMBERS_SQL
    finally:
        monkeypatch.undo()
        importlib.reload(tenancy)
    assert "approvals_membership" in tenancy._MEMBERS_SQL
