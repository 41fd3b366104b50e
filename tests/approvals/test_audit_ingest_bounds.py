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

from typing import Any

import pytest

from approvals.access import tokens
from approvals.models import AuditEvent, AuditIngestion, Tenant
from tests.approvals.test_audit_ingest import body_of, post, producer_event
from tests.approvals.test_reviewer_tokens import pat_for
from tests.conftest import Runtime

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
