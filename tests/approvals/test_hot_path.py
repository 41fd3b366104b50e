"""Issue 28, the floor: an authenticated API request writes nothing to the database before
its handler runs, and the agent's hot calls make a pinned number of statements.

The cheapest authenticated call, a GET of an occurrence that does not exist (404), is
asked once to warm up (a key's ``last_used_at`` is written at most once a minute, and the
first request of a window may report the key's ended windows), then again with every
statement captured: with the rate limit counted in Redis, as a deployment with Redis
counts it, the second request reads and never writes.

Below, the statements of a proposal, an auto-admitted proposal, a token pickup and a claim
after authentication (the runtime key's read), pinned one by one: a query added to any of
them fails here and says which. Inside the test's transaction a service's transaction is a
SAVEPOINT and its RELEASE; served, it is BEGIN and COMMIT, the same round trips.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval, AuditEvent, Tenant, ToolContract
from tests.approvals.test_reviewer_tokens import pat_for
from tests.conftest import Runtime, approve

UNKNOWN = "00000000-0000-4000-8000-000000000000"
_WRITES = ("INSERT", "UPDATE", "DELETE", "MERGE")


def writes(queries: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(_WRITES)
    ]


def test_the_cheapest_authenticated_call_writes_nothing(
    runtime: Runtime, redis_rate_limit: str
) -> None:
    assert runtime.get(f"/api/v1/occurrences/{UNKNOWN}").status_code == 404

    with CaptureQueriesContext(connection) as queries:
        answer = runtime.get(f"/api/v1/occurrences/{UNKNOWN}")

    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"
    assert queries.captured_queries, "the request read nothing: the capture saw nothing"
    assert writes(queries) == []


def test_a_reviewer_access_tokens_call_writes_nothing(
    reviewer: Any, tenant: Tenant, redis_rate_limit: str
) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {pat_for(reviewer, tenant)}")
    assert client.get(f"/api/v1/occurrences/{UNKNOWN}").status_code == 404

    with CaptureQueriesContext(connection) as queries:
        answer = client.get(f"/api/v1/occurrences/{UNKNOWN}")

    assert answer.status_code == 404
    assert queries.captured_queries
    assert writes(queries) == []


# --- the statements of the hot calls, after authentication ---------------------------------

_TABLE = re.compile(r'(?:^INSERT INTO|^UPDATE| FROM) "?(\w+)"?')
_PARENTHESES = re.compile(r"\([^()]*\)")


def statement(sql: str) -> str:
    """A statement as ``VERB table`` (the table it reads from, outside any subquery, or the
    one it writes), ``SAVEPOINT``/``RELEASE``, ``WITH`` (the claim's one statement), or as
    it is (``SELECT CURRENT_TIMESTAMP``)."""
    sql = " ".join(sql.split())
    verb = sql.split(" ", 1)[0].upper()
    if verb in ("SAVEPOINT", "RELEASE", "WITH"):
        return verb
    outer = sql
    while _PARENTHESES.search(outer):
        outer = _PARENTHESES.sub("", outer)
    found = _TABLE.search(outer)
    return f"{verb} {found.group(1)}" if found else sql


def after_authentication(queries: CaptureQueriesContext) -> list[str]:
    """The statements after the runtime key's read, which must come first."""
    shapes = [statement(q["sql"]) for q in queries.captured_queries]
    assert shapes[:1] == ["SELECT approvals_runtimekey"], shapes
    return shapes[1:]


def _sql(queries: CaptureQueriesContext) -> str:
    return "\n".join(q["sql"][:200] for q in queries.captured_queries)


# What a new proposal does: the contract, the transaction with its three rows and the
# notification outbox's event (the routing rule is a subquery of the occurrence's INSERT),
# then the run's earlier rejections of the same action for the answer (``prior_decisions``).
# Nothing before the insert looks for the client_ref (its unique constraint does), and
# nothing reads back what was written.
PROPOSE = [
    "SELECT approvals_toolcontract",
    "SAVEPOINT",
    "INSERT approvals_occurrence",
    "INSERT approvals_proposal",
    "INSERT approvals_auditevent",
    "INSERT approvals_notificationevent",
    "RELEASE",
    "SELECT approvals_occurrence",
]
# An auto-admitted proposal: the same, with no reviewer to notify (its two audit events
# are one INSERT).
AUTO_ADMITTED = [statement for statement in PROPOSE if "notificationevent" not in statement]
# The approval with its occurrence (one tenant-scoped read), the guarded UPDATE that hands
# out the token and its audit event; the answer is the row as the UPDATE left it.
PICKUP = [
    "SELECT approvals_approval",
    "SAVEPOINT",
    "UPDATE approvals_approval",
    "INSERT approvals_auditevent",
    "RELEASE",
]
# The contract, the other-key check, and the claim's one statement.
CLAIM = [
    "SELECT approvals_toolcontract",
    "SELECT approvals_approval",
    "SAVEPOINT",
    "WITH",
    "RELEASE",
]


# The statements are PostgreSQL's (SQLite has its own clock, and the claim's ORM path).
on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the statements pinned are PostgreSQL's"
)


def _warm(runtime: Runtime) -> None:
    assert runtime.get(f"/api/v1/occurrences/{UNKNOWN}").status_code == 404


@on_postgresql
def test_a_proposal_makes_its_pinned_statements(runtime: Runtime, redis_rate_limit: str) -> None:
    _warm(runtime)

    with CaptureQueriesContext(connection) as queries:
        answer = runtime.propose(client_ref="call-1")

    assert answer.status_code == 201, answer.content
    assert after_authentication(queries) == PROPOSE, _sql(queries)
    assert answer.json()["status"] == "pending_review"


@on_postgresql
def test_an_auto_admitted_proposal_writes_its_two_events_in_one_insert(
    runtime: Runtime, redis_rate_limit: str
) -> None:
    _warm(runtime)

    with CaptureQueriesContext(connection) as queries:
        answer = runtime.propose(
            tool="lookup_order", arguments={"order_id": "ord_1"}, client_ref="call-1"
        )

    assert answer.status_code == 201, answer.content
    assert after_authentication(queries) == AUTO_ADMITTED, _sql(queries)
    assert answer.json()["status"] == "auto_admitted"
    events = AuditEvent.objects.filter(occurrence_id=answer.json()["occurrence_id"])
    assert list(events.order_by("id").values_list("kind", flat=True)) == [
        "occurrence.proposed",
        "occurrence.auto_admitted",
    ]


@on_postgresql
def test_a_contract_with_deadlines_asks_the_database_clock_once(
    runtime: Runtime, redis_rate_limit: str
) -> None:
    ToolContract.objects.filter(name="issue_refund").update(review_deadline=timedelta(minutes=5))
    _warm(runtime)

    with CaptureQueriesContext(connection) as queries:
        answer = runtime.propose(client_ref="call-1")

    assert answer.status_code == 201, answer.content
    clock = "SELECT CURRENT_TIMESTAMP"
    assert after_authentication(queries) == [*PROPOSE[:2], clock, *PROPOSE[2:]], _sql(queries)


def test_a_retried_proposal_answers_as_the_first_and_writes_nothing(
    runtime: Runtime, redis_rate_limit: str
) -> None:
    first = runtime.propose(client_ref="call-1")
    events = AuditEvent.objects.count()

    again = runtime.propose(client_ref="call-1")
    other = runtime.propose(
        client_ref="call-1",
        arguments={"payment_id": "pay_9", "amount_minor": 1, "currency": "EUR", "reason": "x"},
    )

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "client_ref_conflict"
    assert AuditEvent.objects.count() == events


@on_postgresql
def test_a_token_pickup_makes_its_pinned_statements(
    runtime: Runtime, reviewer: Any, redis_rate_limit: str
) -> None:
    occurrence_id = runtime.propose(client_ref="call-1").json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    _warm(runtime)

    with CaptureQueriesContext(connection) as queries:
        answer = runtime.token(occurrence_id)

    assert answer.status_code == 200, answer.content
    assert after_authentication(queries) == PICKUP, _sql(queries)
    # The answer, built without reading the row back, is what the row holds.
    row = Approval.objects.get(occurrence_id=occurrence_id)
    body = answer.json()
    assert body["fingerprint"] == row.fingerprint
    # (The answer's times are in milliseconds.)
    assert abs(datetime.fromisoformat(body["expires_at"]) - row.expires_at) < timedelta(
        milliseconds=1
    )
    assert body["execution_id"] is None and row.bound_execution_id == ""
    assert row.delivered_at is not None


@on_postgresql
def test_a_claim_makes_its_pinned_statements(
    runtime: Runtime, token: str, redis_rate_limit: str
) -> None:
    _warm(runtime)

    with CaptureQueriesContext(connection) as queries:
        answer = runtime.claim(token, "exec-1")

    assert answer.status_code == 200, answer.content
    assert answer.json()["decision"] == "approved"
    assert after_authentication(queries) == CLAIM, _sql(queries)
