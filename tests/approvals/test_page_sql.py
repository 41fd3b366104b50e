"""The pages' reads in plain SQL (PostgreSQL) answer as their ORM twins do (what SQLite
runs): the same rows, related objects, annotations and lists, for each set of values."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection

from approvals.models import Occurrence, Tenant
from approvals.web.selectors import review as review_reads
from approvals.web.selectors.review import Reviewed, review_get
from tests.conftest import Runtime, make_runtime

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
