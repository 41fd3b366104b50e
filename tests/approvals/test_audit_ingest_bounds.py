"""Issue 23: what ingestion keeps out of the audit trail, and how much a duplicate keeps.

- every kind of secret the console issues is refused in any field of an ingested line
  (approval tokens and runtime keys were; reviewers' access tokens ``pat_`` and callback
  secrets ``whsec_`` were stored);
- duplicate deliveries are bounded: one row per batch and per thing said, with the count of
  lines; the line as sent only when it says something else than the stored event, and at
  most ``DUPLICATE_PAYLOADS_KEPT`` of those per stored event. The evidence of a duplicated
  audit delivery stays: which batch brought the event again, when, at which line, how many
  times, and whether it said the same thing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from approvals.access import tokens
from approvals.audit.ingest import DUPLICATE_PAYLOADS_KEPT
from approvals.models import AuditDuplicateDelivery, AuditEvent, AuditIngestion, Tenant
from tests.approvals.test_audit_ingest import body_of, post, producer_event
from tests.approvals.test_reviewer_tokens import pat_for
from tests.conftest import Runtime, make_runtime
from tests.reconciliation.test_investigations import investigate, ops

__all__ = ["ops"]  # a fixture

# Literal, not tokens.SECRET_PREFIXES: the test says which secrets, the code must follow.
PREFIXES = ["apv_", "rk_", "pat_", "whsec_"]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("field", ["execution_id", "message_id", "kind", "reason_code"])
def test_every_secret_the_console_issues_is_refused(
    runtime: Runtime, prefix: str, field: str
) -> None:
    secret = tokens.mint(prefix)
    line = producer_event(**{field: f"leaked {secret}"[:64] if field == "reason_code" else secret})

    response = post(runtime, body_of(producer_event(), line))

    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == "raw_token"
    assert error["details"] == [
        {"line": 2, "field": field, "code": "raw_token", "message": error["details"][0]["message"]}
    ]
    assert secret not in response.content.decode()
    assert not AuditEvent.objects.exists() and not AuditIngestion.objects.exists()


def test_the_console_mints_no_secret_the_audit_trail_would_take() -> None:
    assert set(PREFIXES) == set(tokens.SECRET_PREFIXES)


def test_a_reviewers_live_access_token_is_refused(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    raw = pat_for(reviewer, tenant)

    response = post(runtime, body_of(producer_event(execution_id=raw)))

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "raw_token"
    assert not AuditEvent.objects.filter(execution_id=raw).exists()


def test_a_thousand_copies_of_a_line_in_one_batch_are_one_row_counted(runtime: Runtime) -> None:
    event = producer_event()
    post(runtime, body_of(event))

    answer = post(runtime, body_of(*[event] * 1000)).json()

    assert (answer["received"], answer["new"], answer["duplicates"]) == (1000, 0, 1000)
    row = AuditDuplicateDelivery.objects.get()
    assert (row.ingestion_id, row.line, row.copies) == (answer["ingestion_id"], 1, 1000)
    assert row.same_payload and row.payload is None  # the stored event is what it said
    assert row.original == AuditEvent.objects.get()


def test_each_batch_that_brings_an_event_again_is_its_own_delivery(runtime: Runtime) -> None:
    event = producer_event()
    post(runtime, body_of(event))

    batches = [post(runtime, body_of(producer_event(), event, event)).json() for _ in range(3)]

    rows = list(AuditDuplicateDelivery.objects.order_by("id"))
    assert [r.ingestion_id for r in rows] == [b["ingestion_id"] for b in batches]
    assert [(r.line, r.copies, r.same_payload) for r in rows] == [(2, 2, True)] * 3


def test_a_line_saying_something_else_keeps_the_line_as_sent(runtime: Runtime) -> None:
    event = producer_event()
    post(runtime, body_of(event))
    other = {**event, "decision": "replayed"}

    post(runtime, body_of(event, other, other, event))

    rows = list(AuditDuplicateDelivery.objects.order_by("id"))
    assert [(r.line, r.copies, r.same_payload) for r in rows] == [(1, 2, True), (2, 2, False)]
    assert rows[0].payload is None
    assert rows[1].payload == other


def test_lines_saying_something_else_are_kept_up_to_the_bound_then_counted(
    runtime: Runtime,
) -> None:
    event = producer_event()
    post(runtime, body_of(event))
    variants = [{**event, "execution_id": f"other-{n}"} for n in range(DUPLICATE_PAYLOADS_KEPT + 5)]

    post(runtime, body_of(*variants[:4]))
    last = post(runtime, body_of(*variants[4:], *variants[4:])).json()

    kept = AuditDuplicateDelivery.objects.filter(payload__isnull=False).order_by("id")
    assert [(r.payload or {})["execution_id"] for r in kept] == [
        v["execution_id"] for v in variants[:DUPLICATE_PAYLOADS_KEPT]
    ]
    counted = AuditDuplicateDelivery.objects.get(payload__isnull=True)
    assert counted.ingestion_id == last["ingestion_id"]
    assert not counted.same_payload
    assert counted.copies == 2 * 5  # the five variants past the bound, each sent twice
    assert counted.line == DUPLICATE_PAYLOADS_KEPT - 4 + 1  # the first not kept
    total = sum(AuditDuplicateDelivery.objects.values_list("copies", flat=True))
    assert total == 4 + 2 * len(variants[4:]) == last["duplicates"] + 4


def _table_bytes() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s)", [AuditDuplicateDelivery._meta.db_table])
        (size,) = cursor.fetchone()
    return int(size)


def test_a_batch_of_duplicates_costs_a_row_not_a_megabyte(runtime: Runtime) -> None:
    # The flood of the issue: the same line over and over, a 1 MiB batch after another.
    event = producer_event(execution_id="x" * 200, message_id="y" * 200)
    post(runtime, body_of(event))
    line = json.dumps(event).encode() + b"\n"
    batch = line * (1024 * 1024 // len(line))
    before = _table_bytes()

    for _ in range(5):
        assert post(runtime, batch).status_code == 200

    assert AuditDuplicateDelivery.objects.count() == 5
    # A table's first pages and index pages are allocated whole: a few pages, not 5 MiB.
    assert _table_bytes() - before < 64 * 1024


@pytest.mark.django_db
def test_the_investigation_counts_every_copy(tenant: Tenant, ops: Any) -> None:
    producer = make_runtime(tenant, "log-shipper")
    event = producer_event(fingerprint="d0d0d0d0d0d0d0d0")
    post(producer, body_of(event))
    post(producer, body_of(*[event] * 40))

    status, page = investigate(ops, event["fingerprint"])

    assert status == 200
    assert "delivered 41 times" in page
    assert "line 1 and 39 more" in page
