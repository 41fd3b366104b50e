"""The API's rate limit counted in Redis (``approvals.access.ratecounter``): the same
promises as counted in the database, and the same tests hold them.

The rate-limit tests of ``test_abuse`` and ``test_reviewer_tokens_hardening`` are collected
here again with the limit counted in the real Redis ``REDIS_URL`` names (each test under a
key prefix of its own). Below them, what only Redis counting does: nothing written for a
request within its limit, counters that expire, and the database counter taking over while
Redis does not answer.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.conf import settings as django_settings

from approvals.access import ratecounter, ratelimit
from approvals.models import AuditEvent, ReviewerTokenUsage, RuntimeKeyUsage, Tenant
from tests.approvals.test_abuse import (
    T0,
    bogus_token,
    clock,
    test_a_hundred_bogus_claims_get_429s_and_leave_a_bounded_trail,
    test_a_new_window_admits_again,
    test_a_quiet_keys_burst_is_reported_once_by_the_beat_task,
    test_a_refused_request_writes_nothing,
    test_a_window_without_a_burst_leaves_no_event,
    test_each_key_has_its_own_limit,
    test_refusals_that_name_a_real_approval_are_always_recorded,
    test_the_counter_is_exact_across_concurrent_connections,
    test_the_execution_endpoints_are_limited_too,
    test_the_limit_comes_from_settings_unless_the_tenant_sets_its_own,
)
from tests.approvals.test_reviewer_tokens import pat_for
from tests.approvals.test_reviewer_tokens_hardening import (
    pending,
    read,
    test_a_quiet_tokens_burst_is_reported_by_the_beat_task,
    test_a_token_beyond_the_limit_gets_429_with_retry_after,
    test_a_window_within_the_limit_leaves_no_event,
    test_each_token_has_its_own_count_and_the_tenant_limit_applies,
)
from tests.conftest import Runtime

__all__ = [  # collected again, with the limit counted in Redis
    "clock",
    "pending",
    "test_a_hundred_bogus_claims_get_429s_and_leave_a_bounded_trail",
    "test_a_new_window_admits_again",
    "test_a_quiet_keys_burst_is_reported_once_by_the_beat_task",
    "test_a_quiet_tokens_burst_is_reported_by_the_beat_task",
    "test_a_refused_request_writes_nothing",
    "test_a_token_beyond_the_limit_gets_429_with_retry_after",
    "test_a_window_within_the_limit_leaves_no_event",
    "test_a_window_without_a_burst_leaves_no_event",
    "test_each_key_has_its_own_limit",
    "test_each_token_has_its_own_count_and_the_tenant_limit_applies",
    "test_refusals_that_name_a_real_approval_are_always_recorded",
    "test_the_counter_is_exact_across_concurrent_connections",
    "test_the_execution_endpoints_are_limited_too",
    "test_the_limit_comes_from_settings_unless_the_tenant_sets_its_own",
]

CURSOR = "/api/v1/audit/events/cursor"


@pytest.fixture(autouse=True)
def counted_in_redis(redis_rate_limit: str) -> str:
    return redis_rate_limit


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(django_settings.API_RATE_LIMIT_REDIS_URL)


def counter_key(kind: str, caller_id: int, window_start: int) -> str:
    return f"{django_settings.API_RATE_LIMIT_REDIS_PREFIX}:{kind}:{caller_id}:{window_start}"


def test_requests_within_the_limit_are_counted_in_redis_alone(
    runtime: Runtime, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 5
    assert [runtime.get(CURSOR).status_code for _ in range(3)] == [200] * 3

    key = counter_key("rk", runtime.key.pk, 1_800_000_000)
    assert redis_client().get(key) == b"3"
    # Expires after the window and the time its report may take (2 windows + 60 s).
    assert 0 < redis_client().ttl(key) <= 180
    assert not RuntimeKeyUsage.objects.exists()


def test_a_request_over_the_limit_keeps_redis_count_in_its_row(
    runtime: Runtime, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 2
    answers = [runtime.get(CURSOR) for _ in range(4)]

    assert [a.status_code for a in answers] == [200, 200, 429, 429]
    assert answers[3]["Retry-After"] == "30"
    (row,) = RuntimeKeyUsage.objects.all()
    assert (row.window_start, row.requests, row.request_limit) == (1_800_000_000, 4, 2)


def test_a_tokens_burst_is_reported_by_its_next_window(
    reviewer: Any, tenant: Tenant, pending: str, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 2
    raw = pat_for(reviewer, tenant, name="script")
    for _ in range(5):
        read(raw, pending)

    clock[0] = T0 + 60
    assert read(raw, pending).status_code == 200

    (burst,) = AuditEvent.objects.filter(kind=ratelimit.BURST_EVENT)
    assert (burst.data["requests"], burst.data["request_limit"]) == (5, 2)
    assert burst.data["rate_limited"] == burst.data["count"] == 3
    # Reported and deleted; the new window, within its limit, has no row.
    assert not ReviewerTokenUsage.objects.exists()


def test_without_redis_the_database_counts_and_the_limit_holds(
    runtime: Runtime, clock: list[float], settings: Any
) -> None:
    # Nothing listens on port 1: the connection is refused at once.
    settings.API_RATE_LIMIT_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.API_RATE_LIMIT = 2

    answers = [runtime.get(CURSOR) for _ in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json()["error"]["code"] == "rate_limited"
    assert RuntimeKeyUsage.objects.get(runtime_key=runtime.key).requests == 3
    # The process leaves that Redis alone for a while instead of failing on every request.
    assert ratecounter.count("rk", runtime.key.pk, 1_800_000_000, 60) is None


def test_a_redis_down_for_one_url_does_not_stop_another(
    runtime: Runtime, clock: list[float], settings: Any
) -> None:
    real = settings.API_RATE_LIMIT_REDIS_URL
    settings.API_RATE_LIMIT_REDIS_URL = "redis://127.0.0.1:1/0"
    runtime.get(CURSOR)
    settings.API_RATE_LIMIT_REDIS_URL = real

    assert runtime.get(CURSOR).status_code == 200
    assert redis_client().get(counter_key("rk", runtime.key.pk, 1_800_000_000)) == b"1"


def _lifetimes() -> dict[str, int]:
    """Every key under this test's prefix, by its name after the prefix, with its TTL."""
    client = redis_client()
    prefix = f"{django_settings.API_RATE_LIMIT_REDIS_PREFIX}:"
    return {
        key.decode().removeprefix(prefix): client.ttl(key)
        for key in client.scan_iter(match=f"{prefix}*")
    }


def test_every_key_the_counters_write_expires(
    runtime: Runtime,
    reviewer: Any,
    tenant: Tenant,
    pending: str,
    clock: list[float],
    settings: Any,
) -> None:
    settings.API_RATE_LIMIT = 2
    raw = pat_for(reviewer, tenant, name="script")
    # Within and over the limit (a counter, and the flag of rows to report), for a runtime
    # key and a reviewer's access token, and an unknown token's refusal (a row, the flag).
    assert [runtime.get(CURSOR).status_code for _ in range(3)] == [200, 200, 429]
    assert [read(raw, pending).status_code for _ in range(3)] == [200, 200, 429]
    settings.API_RATE_LIMIT = 100
    assert runtime.claim(bogus_token(), "exec-x").json()["decision"] == "unknown_token"

    window = 1_800_000_000
    key_id, token_id = runtime.key.pk, ReviewerTokenUsage.objects.get().reviewer_token_id
    lifetimes = _lifetimes()
    # (The fixtures' own requests, made before the clock froze, left a counter too.)
    assert set(lifetimes) >= {
        f"rk:{key_id}:{window}",
        f"rk:{key_id}:rows",
        f"rt:{token_id}:{window}",
        f"rt:{token_id}:rows",
    }
    for name, ttl in lifetimes.items():
        limit = ratecounter.ROWS_FLAG_SECONDS if name.endswith(":rows") else 2 * 60 + 60
        assert 0 < ttl <= limit, (name, ttl)


def test_a_counter_left_without_an_expiry_gets_one_at_its_next_count(
    runtime: Runtime, clock: list[float]
) -> None:
    key = counter_key("rk", runtime.key.pk, 1_800_000_000)
    redis_client().set(key, 5)
    assert redis_client().ttl(key) == -1

    assert runtime.get(CURSOR).status_code == 200

    assert redis_client().get(key) == b"6"
    assert 0 < redis_client().ttl(key) <= 180
