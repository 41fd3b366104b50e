"""The indexes a page's queries rely on are ones PostgreSQL can use for them: each test runs
the page's own query with sequential and bitmap scans switched off, so the plan names the
index if, and only if, the query's conditions imply the index's."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Approval, AuditEvent, Command, Occurrence
from approvals.vocabulary import AuditKind, QueueReason
from approvals.web.selectors.review import effect_evidence
from reconciliation.investigations import reads as investigation_reads
from reconciliation.investigations.gather import investigation_get
from reconciliation.selectors.queue import queue_counts, queue_items
from tests.conftest import Runtime

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="query plans are PostgreSQL's"
)


def plan_of(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


def drop_other_indexes(table: str, keep: str) -> None:
    """Drop, inside the test's transaction (rolled back after it), every index of the table
    that no constraint needs, but ``keep``: the planner's choice between indexes follows
    the table's statistics, which whatever ran before in the same database left (the
    tenant's plain index is as cheap as a partial one on a near-empty table). What stays
    is a full scan of a constraint's index, costed as such, or ``keep`` if the query's
    conditions imply it."""
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT i.relname FROM pg_index x
                 JOIN pg_class i ON i.oid = x.indexrelid
                 JOIN pg_class t ON t.oid = x.indrelid
                WHERE t.relname = %s AND i.relname <> %s
                  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.oid)""",
            [table, keep],
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f'DROP INDEX "{name}"')


@pytest.mark.django_db(transaction=False)
def test_the_effect_line_reads_the_commands_effect_index(
    runtime: Runtime, approved: str, token: str
) -> None:
    assert runtime.claim(token, "exec-1").status_code == 200
    occurrence = Occurrence.objects.get(pk=approved)
    command = Command.objects.get(occurrence=occurrence)
    with CaptureQueriesContext(connection) as queries:
        effect_evidence(occurrence, command)
    (query,) = queries.captured_queries
    assert "audit_command_effects" in plan_of(query["sql"])


def test_the_queues_expired_unclaimed_reads_the_open_approvals_index(
    runtime: Runtime, approved: str
) -> None:
    # The operations queue (reconciliation) reads approvals through an approvals index.

    Approval.objects.filter(occurrence_id=approved).update(
        issued_at=timezone.now() - timedelta(hours=1),
        expires_at=timezone.now() - timedelta(minutes=1),
    )
    now = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        counts = queue_counts(tenant_ids=[runtime.key.tenant_id], now=now)
        items = queue_items(tenant_ids=[runtime.key.tenant_id], now=now, counts=counts)
    assert counts[QueueReason.EXPIRED_UNCLAIMED] == 1 and len(items) == 1
    reads = [
        q["sql"]
        for q in queries.captured_queries
        if re.search(r'FROM "?approvals_approval"?', q["sql"])
    ]
    assert len(reads) == 2  # the count and the rows
    drop_other_indexes("approvals_approval", keep="approval_unclaimed_expiry")
    for sql in reads:
        assert "approval_unclaimed_expiry" in plan_of(sql), sql


def test_an_investigations_events_are_not_found_by_walking_the_table(
    runtime: Runtime, approved: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chain's newest events, and its decisive ones before them, are found through the
    chain's own indexes, never by walking the primary key or the tenant's (tenant, id)
    index in id order from the newest (or oldest) event: for an old chain, that is every
    event written since. With sorting switched off, a plan that can walk them would."""

    assert runtime.claim(token, "exec-1").status_code == 200
    fingerprint = Approval.objects.get(occurrence_id=approved).fingerprint
    # An old chain: the tenant wrote many events since, and the table's statistics say so
    # (not whatever the tests before this one left: on a near-empty table, walking the
    # ids in order is as cheap as the chain's own indexes, and PostgreSQL may pick either).
    AuditEvent.objects.bulk_create(
        AuditEvent(
            tenant_id=runtime.key.tenant_id,
            kind=AuditKind.OCCURRENCE_PROPOSED,
            source_time=timezone.now(),
        )
        for _ in range(500)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE approvals_auditevent")
    # Fewer events read than the chain holds: the decisive ones are then read on their own.
    monkeypatch.setattr(investigation_reads, "EVENT_LIMIT", 1)
    with CaptureQueriesContext(connection) as queries:
        found = investigation_get(q=fingerprint, tenant_ids=[runtime.key.tenant_id])
    assert found.facts.events_total > 1
    ordered = [
        q["sql"]
        for q in queries.captured_queries
        if re.search(r'FROM "?approvals_auditevent"?', q["sql"])
        and " LIMIT " in q["sql"]
        # not the seeds' read (the newest's is SELECT DISTINCT ON)
        and not re.match(r"\s*SELECT DISTINCT (?!ON)", q["sql"])
    ]
    assert len(ordered) == 2  # the newest, the decisive
    [tenant_id_index] = [
        index.name
        for index in AuditEvent._meta.indexes
        if index.fields == ["tenant", "id"] and index.condition is None
    ]
    for sql in ordered:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "approvals_auditevent_pkey" not in plan and tenant_id_index not in plan, plan


def test_an_investigation_by_command_reads_the_ingested_events_command_index(
    runtime: Runtime,
) -> None:
    """Other producers' events naming a command (an investigation by command id) are found
    through their own index, newest first, not by walking every event the tenant's
    producers ever sent."""
    import json
    import uuid

    command_id = str(uuid.uuid4())
    lines = [
        {
            "event_id": str(uuid.uuid4()),
            "kind": "approval_decision",
            "fingerprint": "feedface00000001",
            "decision": "refused" if n else "approved",
            "execution_id": f"exec-{n}",
            "message_id": f"msg-{n}",
            "command_id": command_id,
            "source_time": "2026-08-04T10:00:00.000000Z",
        }
        for n in range(3)
    ]
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    response = runtime.client.post(
        "/api/v1/audit/events", body, content_type="application/x-ndjson"
    )
    assert response.status_code == 200, response.content

    with CaptureQueriesContext(connection) as queries:
        found = investigation_get(q=command_id, tenant_ids=[runtime.key.tenant_id])
    assert len(found.facts.events) == 3
    [newest] = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT DISTINCT ON")
    ]
    plan = plan_of(newest)
    assert "audit_ingested_command" in plan, plan
    assert "audit_ingested_event_once" not in plan and "audit_ingested " not in plan, plan
