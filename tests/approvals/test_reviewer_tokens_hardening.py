"""Issue 23: a reviewer's access token works only while its owner reviews in its tenant,
and it is held to the API's rate limit like a runtime key.

- membership is checked on every use: a reviewer removed from the tenant can no longer read
  occurrences or long-poll with her token (403 ``forbidden``, as her decisions were; a wait
  in progress ends so too, and with 401 when the token is revoked meanwhile);
- every request with a token is counted per token and window; beyond the limit the API
  answers ``429 rate_limited`` with ``Retry-After``, and a window that went over is
  reported by one ``security.refusals_burst`` event naming the token and its owner.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.access import ratelimit, reviewer_tokens
from approvals.models import AuditEvent, Membership, ReviewerToken, ReviewerTokenUsage, Tenant
from tests.approvals.test_abuse import T0, clock
from tests.approvals.test_reviewer_tokens import decide, digest_of, pat_for
from tests.conftest import Runtime

__all__ = ["clock"]  # a fixture


@pytest.fixture
def pending(runtime: Runtime) -> str:
    response = runtime.propose()
    assert response.status_code == 201, response.content
    occurrence_id: str = response.json()["occurrence_id"]
    return occurrence_id


def read(raw: str, occurrence_id: str, query: str = "") -> Any:
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get(
        f"/api/v1/occurrences/{occurrence_id}{query}"
    )


# --- membership on every use ------------------------------------------------------------------


def test_a_reviewer_removed_from_the_tenant_can_no_longer_read(
    reviewer: Any, tenant: Tenant, pending: str
) -> None:
    raw = pat_for(reviewer, tenant)
    assert read(raw, pending).status_code == 200

    Membership.objects.filter(user=reviewer, tenant=tenant).delete()

    # Refused as a decision of hers always was: 403 forbidden, before anything is read.
    answer = read(raw, pending)
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "forbidden"
    assert "no longer a reviewer" in answer.json()["error"]["message"]
    assert read(raw, pending, "?wait=1").status_code == 403
    refused = decide(raw, pending, {"decision": "approve", "seen_digest": digest_of(pending)})
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")


def test_a_reviewer_who_is_now_only_an_operator_is_refused(
    reviewer: Any, tenant: Tenant, pending: str
) -> None:
    raw = pat_for(reviewer, tenant)
    Membership.objects.filter(user=reviewer, tenant=tenant).update(role=Membership.Role.OPERATOR)

    assert read(raw, pending).status_code == 403


def test_a_reviewer_of_another_tenant_only_is_refused(
    reviewer: Any, tenant: Tenant, other_tenant: Tenant, pending: str
) -> None:
    raw = pat_for(reviewer, tenant)
    Membership.objects.filter(user=reviewer, tenant=tenant).update(tenant=other_tenant)

    assert read(raw, pending).status_code == 403


def test_a_wait_in_progress_ends_when_the_owner_leaves_the_tenant(
    reviewer: Any, tenant: Tenant, pending: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under WSGI the view waits in its thread, reading at intervals: before each read it
    asks whether the token still holds (under ASGI every read authenticates again)."""
    settings.LONG_POLL_FALLBACK_SECONDS = 0.05
    raw = pat_for(reviewer, tenant)
    real_sleep = time.sleep

    def remove_then_sleep(seconds: float) -> None:
        Membership.objects.filter(user=reviewer, tenant=tenant).delete()
        real_sleep(seconds)

    monkeypatch.setattr("approvals.api.occurrences.time.sleep", remove_then_sleep)
    started = time.monotonic()

    answer = read(raw, pending, "?wait=30")

    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "forbidden")
    assert time.monotonic() - started < 5


def test_a_wait_in_progress_ends_when_the_token_is_revoked(
    reviewer: Any, tenant: Tenant, pending: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LONG_POLL_FALLBACK_SECONDS = 0.05
    raw = pat_for(reviewer, tenant)
    real_sleep = time.sleep

    def revoke_then_sleep(seconds: float) -> None:
        ReviewerToken.objects.update(revoked_at=timezone.now())
        real_sleep(seconds)

    monkeypatch.setattr("approvals.api.occurrences.time.sleep", revoke_then_sleep)

    answer = read(raw, pending, "?wait=30")

    assert (answer.status_code, answer.json()["error"]["code"]) == (401, "unauthenticated")


def test_a_wait_in_progress_still_answers_a_reviewer_who_stays(
    reviewer: Any, tenant: Tenant, pending: str, settings: Any
) -> None:
    settings.LONG_POLL_FALLBACK_SECONDS = 0.05
    raw = pat_for(reviewer, tenant)

    answer = read(raw, pending, "?wait=1")

    assert answer.status_code == 200
    assert answer.json()["occurrence_id"] == pending


def test_authentication_stays_one_query(
    reviewer: Any, tenant: Tenant, django_assert_num_queries: Any
) -> None:
    raw = pat_for(reviewer, tenant)
    reviewer_tokens.reviewer_token_authenticate(raw)  # writes last_used_at once a minute

    with django_assert_num_queries(1):
        assert reviewer_tokens.reviewer_token_authenticate(raw) is not None


# --- the rate limit ---------------------------------------------------------------------------


def test_a_token_beyond_the_limit_gets_429_with_retry_after(
    reviewer: Any, tenant: Tenant, pending: str, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 3
    raw = pat_for(reviewer, tenant)

    answers = [read(raw, pending) for _ in range(5)]

    assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
    limited = answers[3]
    assert limited["Retry-After"] == "30"  # the window ends 30 s after T0
    assert limited.json()["error"] == {
        "code": "rate_limited",
        "message": "This access token made more than 3 requests in 60 seconds; "
        "retry after 30 seconds.",
        "details": None,
    }
    # A decision is a request like any other: refused before anything is decided.
    refused = decide(raw, pending, {"decision": "approve", "seen_digest": digest_of(pending)})
    assert refused.status_code == 429
    assert not AuditEvent.objects.filter(kind__startswith="approval.").exists()


def test_each_token_has_its_own_count_and_the_tenant_limit_applies(
    reviewer: Any, second_reviewer: Any, tenant: Tenant, pending: str, clock: list[float]
) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(api_rate_limit=2)
    mine, theirs = pat_for(reviewer, tenant), pat_for(second_reviewer, tenant)

    assert [read(mine, pending).status_code for _ in range(3)] == [200, 200, 429]
    assert read(theirs, pending).status_code == 200


def test_a_new_window_admits_again_and_the_burst_is_reported_once(
    reviewer: Any, tenant: Tenant, pending: str, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 2
    raw = pat_for(reviewer, tenant, name="script")
    for _ in range(5):
        read(raw, pending)

    clock[0] = T0 + 60
    assert read(raw, pending).status_code == 200

    (burst,) = AuditEvent.objects.filter(kind=ratelimit.BURST_EVENT)
    assert burst.tenant == tenant
    assert burst.actor.startswith("token:script (pat_")
    assert burst.reason_code == "refusals_burst"
    assert (burst.data["requests"], burst.data["request_limit"]) == (5, 2)
    assert burst.data["rate_limited"] == burst.data["count"] == 3
    assert (burst.data["token"], burst.data["owner"]) == ("script", "rita")
    assert burst.data["window_start"] == "2027-01-15T08:00:00+00:00"
    assert list(ReviewerTokenUsage.objects.values_list("window_start", flat=True)) == [
        1_800_000_060
    ]


def test_a_quiet_tokens_burst_is_reported_by_the_beat_task(
    reviewer: Any, tenant: Tenant, pending: str, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 1
    raw = pat_for(reviewer, tenant)
    for _ in range(3):
        read(raw, pending)
    clock[0] = T0 + 29
    assert ratelimit.usage_report_closed() == 0

    clock[0] = T0 + 30
    assert ratelimit.usage_report_closed() == 1
    assert ratelimit.usage_report_closed() == 0
    assert AuditEvent.objects.get(kind=ratelimit.BURST_EVENT).data["rate_limited"] == 2
    assert not ReviewerTokenUsage.objects.exists()


def test_a_window_within_the_limit_leaves_no_event(
    reviewer: Any, tenant: Tenant, pending: str, clock: list[float]
) -> None:
    raw = pat_for(reviewer, tenant)
    read(raw, pending)
    clock[0] = T0 + 60

    assert ratelimit.usage_report_closed() == 0
    assert not AuditEvent.objects.filter(kind=ratelimit.BURST_EVENT).exists()
    assert not ReviewerTokenUsage.objects.exists()
