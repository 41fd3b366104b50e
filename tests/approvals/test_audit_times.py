"""An ingested event's ``source_time``: refused outside a sane window around now, and an
out-of-range time already in the table breaks neither the export, the chain nor the pages.

Found by an attacker's probe: ``0001-01-01T00:00:00+14:00`` is a valid ISO 8601 time whose
UTC value (year 0, 1 BC) PostgreSQL stores and Python cannot hold, so every later read of
the row raised ``DataError`` and the tenant's export, chain and the occurrence's pages
answered 500 for good (the row is append-only)."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client

from approvals.models import AuditEvent, AuditIngestion
from tests.approvals.test_api import error_of, ndjson
from tests.approvals.test_audit_ingest import body_of, post, producer_event
from tests.conftest import PASSWORD, Runtime

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "source_time",
    [
        "0001-01-01T00:00:00+14:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-14:00",  # after year 9999 in UTC
        "0001-01-01T00:00:00Z",
        "1999-12-31T23:59:59.999999Z",
        "FUTURE",
    ],
)
def test_a_source_time_outside_the_window_refuses_the_batch_naming_its_line(
    runtime: Runtime, source_time: str
) -> None:
    if source_time == "FUTURE":
        source_time = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    body = body_of(producer_event(), producer_event(source_time=source_time))

    response = post(runtime, body)

    assert response.status_code == 422, response.content
    error = error_of(response)
    assert error["code"] == "time_out_of_range"
    assert error["message"].startswith("line 2: ")
    assert error["details"][0]["field"] == "source_time"
    assert "2000" in error["details"][0]["message"]
    assert not AuditEvent.objects.exists()
    assert not AuditIngestion.objects.exists()


@pytest.mark.parametrize(
    "source_time",
    ["2000-01-01T00:00:00Z", "2000-01-01T05:00:00+05:00", "NEAR_FUTURE"],
)
def test_a_source_time_inside_the_window_is_accepted(runtime: Runtime, source_time: str) -> None:
    if source_time == "NEAR_FUTURE":
        source_time = (datetime.now(UTC) + timedelta(hours=23)).isoformat()

    response = post(runtime, body_of(producer_event(source_time=source_time)))

    assert response.status_code == 200, response.content
    assert AuditEvent.objects.get().source_time == datetime.fromisoformat(source_time)


# --- a row that is already there ------------------------------------------------------


def _insert_out_of_range_event(tenant_id: int, occurrence_id: str, source_time: str) -> None:
    """What an older console stored: a producer's line whose time Python cannot hold. The
    append-only trigger stays on (it allows an INSERT)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO approvals_auditevent
                   (event_id, kind, tenant_id, actor, token_fingerprint, decision,
                    reason_code, execution_id, message_id, command_id, trace_id,
                    occurrence_id, source_time, ingested_at, data)
               VALUES (%s, 'claim.replayed', %s, '', '0123456789abcdef', 'replayed',
                       '', 'exec-old', 'msg-old', NULL, '', %s, %s::timestamptz, now(), '{}')""",
            [str(uuid.uuid4()), tenant_id, occurrence_id, source_time],
        )


def _login(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


@pytest.mark.parametrize("source_time", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_an_out_of_range_time_already_stored_breaks_nothing(
    runtime: Runtime, reviewer: Any, operator: Any, approved: str, source_time: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite cannot hold such a time: only PostgreSQL has these rows")
    _insert_out_of_range_event(runtime.key.tenant_id, approved, source_time)

    export = runtime.get("/api/v1/audit/events")
    assert export.status_code == 200
    lines = ndjson(export)
    odd = [line for line in lines if line["execution_id"] == "exec-old"]
    assert len(odd) == 1
    assert odd[0]["source_time"]  # the stored time, as text, not a 500
    assert runtime.get("/api/v1/audit/events?kind=claim.replayed").status_code == 200

    out, err = io.StringIO(), io.StringIO()
    call_command("verify_audit_chain", stdout=out, stderr=err)  # exits 1 on a problem
    assert "cannot be extended" not in out.getvalue() + err.getvalue()
    # Verified again: the chain reads the row the same way twice.
    call_command("verify_audit_chain", stdout=out, stderr=err)

    as_reviewer, as_operator = _login(reviewer), _login(operator)
    for client, path in [
        (as_reviewer, f"/reviews/{approved}/"),
        (as_reviewer, f"/reviews/{approved}/panel"),
        (as_operator, f"/operations/occurrences/{approved}/"),
        (as_operator, f"/investigations/?q={approved}"),
    ]:
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        assert b"exec-old" in response.content or path.endswith("panel"), path


def test_the_chain_hashes_an_out_of_range_time_as_stored(runtime: Runtime, approved: str) -> None:
    """Two rows differing only in an unreadable time hash differently: the chain does not
    hash a stand-in that would let one be swapped for the other unnoticed."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    tenant_id = runtime.key.tenant_id
    _insert_out_of_range_event(tenant_id, approved, "0001-01-01T00:00:00+14:00")
    _insert_out_of_range_event(tenant_id, approved, "0001-01-01T00:00:00+13:00")
    call_command("verify_audit_chain", stdout=io.StringIO(), stderr=io.StringIO())
    events = list(AuditEvent.objects.filter(execution_id="exec-old").order_by("id"))
    times = [e.chain_form(chain_seq=1, prev_hash="")["source_time"] for e in events]
    assert times[0] != times[1]
    assert all(e.source_time.year == 1 for e in events)  # a stand-in Python can hold
    assert events[0].hash != events[1].hash
