"""Issue 28, the floor: an authenticated API request writes nothing to the database before
its handler runs.

The cheapest authenticated call, a GET of an occurrence that does not exist (404), is
asked once to warm up (a key's ``last_used_at`` is written at most once a minute, and the
first request of a window may report the key's ended windows), then again with every
statement captured: with the rate limit counted in Redis, as a deployment with Redis
counts it, the second request reads and never writes.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import Tenant
from tests.approvals.test_reviewer_tokens import pat_for
from tests.conftest import Runtime

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
