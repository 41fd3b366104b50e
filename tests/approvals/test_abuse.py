"""Issue 9, finding 3: brute force and abuse.

Before: 40 wrong passwords in a row, then the right one, signed in; and 100 bogus claims
wrote 100 permanent audit rows. Now a username is locked out from an address after
``AXES_FAILURE_LIMIT`` failures (the right password included, until the cool-off ends);
Django's four password validators apply; and a runtime key is rate-limited (429 with
``Retry-After``), its refusals with unknown tokens audited one by one only up to a budget
per window, the rest counted into one ``security.refusals_burst`` event.
"""

from __future__ import annotations

import io
import secrets
import threading
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import Client

from approvals.access import ratelimit, tokens
from approvals.models import AuditEvent, Occurrence, RuntimeKeyUsage, Tenant
from tests.conftest import PASSWORD, Runtime, make_runtime

LOGIN = "/accounts/login/"

# --- sign-in throttling ------------------------------------------------------------------------


def sign_in(client: Client, username: str, password: str) -> Any:
    return client.post(LOGIN, {"username": username, "password": password})


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_forty_wrong_passwords_then_the_right_one_is_locked_out(reviewer: Any) -> None:
    client = Client()
    answers = [sign_in(client, "rita", f"wrong-{n}").status_code for n in range(40)]

    right = sign_in(client, "rita", PASSWORD)

    # The first failures are the form's usual error; from the limit on, the lockout page.
    assert answers[:4] == [200] * 4
    assert set(answers[4:]) == {429}
    assert right.status_code == 429
    assert not signed_in(client)
    page = right.content.decode()
    assert "Sign-in paused" in page
    assert "Too many failed sign-ins for <strong>rita</strong>" in page
    assert "after 5 wrong passwords" in page
    assert "for 15 minutes" in page
    assert right["Retry-After"] == "900"
    assert "no-store" in right["Cache-Control"]
    # And the inbox still sends the client to sign in.
    assert client.get("/reviews/").status_code == 302


def test_the_lockout_is_per_username_and_address(reviewer: Any, second_reviewer: Any) -> None:
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for n in range(5):
        sign_in(attacker, "rita", f"wrong-{n}")
    assert sign_in(attacker, "rita", PASSWORD).status_code == 429

    # Rita, from her own address, still signs in; so does another user from the attacker's.
    rita = Client(REMOTE_ADDR="198.51.100.20")
    assert sign_in(rita, "rita", PASSWORD).status_code == 302
    assert signed_in(rita)
    ravi = Client(REMOTE_ADDR="203.0.113.7")
    assert sign_in(ravi, "ravi", PASSWORD).status_code == 302


def test_fewer_failures_than_the_limit_then_the_right_password_signs_in(reviewer: Any) -> None:
    client = Client()
    for n in range(4):
        assert sign_in(client, "rita", f"wrong-{n}").status_code == 200

    assert sign_in(client, "rita", PASSWORD).status_code == 302
    assert signed_in(client)


def test_a_successful_sign_in_resets_the_count(reviewer: Any) -> None:
    client = Client()
    for n in range(4):
        sign_in(client, "rita", f"wrong-{n}")
    assert sign_in(client, "rita", PASSWORD).status_code == 302
    client.logout()

    for n in range(4):
        assert sign_in(client, "rita", f"again-{n}").status_code == 200
    assert sign_in(client, "rita", PASSWORD).status_code == 302


def test_the_lockout_ends_after_the_cool_off(reviewer: Any, settings: Any) -> None:
    from datetime import timedelta

    from axes.models import AccessAttempt

    client = Client()
    for n in range(5):
        sign_in(client, "rita", f"wrong-{n}")
    assert sign_in(client, "rita", PASSWORD).status_code == 429

    # As if the cool-off had passed since the last failure.
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=16)
    )

    assert sign_in(client, "rita", PASSWORD).status_code == 302


def test_the_admin_sign_in_is_throttled_too(tenant: Tenant) -> None:
    get_user_model().objects.create_superuser("root", password=PASSWORD)
    client = Client()
    for n in range(5):
        client.post("/admin/login/", {"username": "root", "password": f"wrong-{n}"})

    response = client.post("/admin/login/?next=/admin/", {"username": "root", "password": PASSWORD})

    assert response.status_code == 429
    assert client.get("/admin/").status_code == 302


# --- password validators ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "password",
    [
        "short-pw",  # under 12 characters
        "password1234",  # common
        "123456789012345",  # all digits
        "rita-the-reviewer",  # too like the username
    ],
)
def test_djangos_four_validators_refuse_weak_passwords(db: Any, password: str) -> None:
    user = get_user_model()(username="rita-the-reviewer", email="rita@example.com")

    with pytest.raises(ValidationError):
        validate_password(password, user)


def test_a_good_password_passes(db: Any) -> None:
    validate_password(secrets.token_urlsafe(16), get_user_model()(username="rita"))


@pytest.mark.parametrize("password", ["password1234", "98765432109876", "short"])
def test_add_member_refuses_a_weak_password(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch, password: str
) -> None:
    monkeypatch.setenv("NEW_PASSWORD", password)

    with pytest.raises(CommandError):
        call_command(
            "add_member",
            "acme",
            "rita",
            "--role",
            "reviewer",
            "--password-env",
            "NEW_PASSWORD",
            stdout=io.StringIO(),
        )

    assert not get_user_model().objects.filter(username="rita").exists()


def test_the_demo_accounts_still_sign_in(db: Any, settings: Any) -> None:
    settings.DEBUG = True  # seed_demo runs only in development
    call_command("seed_demo", stdout=io.StringIO())

    for username, password in [("reviewer", "reviewer-demo"), ("admin", "admin-demo")]:
        client = Client()
        assert sign_in(client, username, password).status_code == 302, username
        assert signed_in(client)


# --- the API's rate limit -----------------------------------------------------------------------

# Mid-window, so that nothing in a test crosses a window's end unless it moves the clock.
T0 = 1_800_000_000 + 30.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The rate limiter's clock, frozen at ``T0``; set ``clock[0]`` to move it."""
    now = [T0]
    monkeypatch.setattr(ratelimit, "now", lambda: now[0])
    return now


def bogus_token() -> str:
    return tokens.APPROVAL_TOKEN_PREFIX + secrets.token_urlsafe(32)


def events_of(runtime: Runtime, kind: str) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(tenant=runtime.key.tenant, kind=kind, actor=runtime.key.actor)
    )


def test_a_hundred_bogus_claims_get_429s_and_leave_a_bounded_trail(
    tenant: Tenant, runtime: Runtime, clock: list[float], settings: Any
) -> None:
    settings.API_AUDITED_REFUSALS_PER_WINDOW = 20
    Tenant.objects.filter(pk=tenant.pk).update(api_rate_limit=50)

    answers = [runtime.claim(bogus_token(), f"exec-{n}") for n in range(100)]

    refused = [a for a in answers if a.status_code == 403]
    limited = [a for a in answers if a.status_code == 429]
    assert len(refused) == 50 and len(limited) == 50
    # The claim's own answer did not change: each of the 50 is its decision.
    assert {a.json()["decision"] for a in refused} == {"unknown_token"}
    assert answers[50].status_code == 429  # the 51st request and every one after it
    for answer in limited:
        assert answer["Retry-After"] == "30"  # the window ends 30 s after T0
        body = answer.json()
        assert set(body) == {"error"}
        assert body["error"]["code"] == "rate_limited"
        assert body["error"]["message"] == (
            "This runtime key made more than 50 requests in 60 seconds; retry after 30 seconds."
        )
    # The first 20 refusals are recorded as before, one event each; nothing else yet.
    assert len(events_of(runtime, "claim.unknown_token")) == 20
    assert AuditEvent.objects.filter(tenant=tenant).count() == 20

    # The window ends; the key's next request reports it.
    clock[0] = T0 + 60
    assert runtime.claim(bogus_token(), "exec-next").status_code == 403

    (burst,) = events_of(runtime, ratelimit.BURST_EVENT)
    assert burst.reason_code == "refusals_burst"
    assert burst.data["count"] == 80
    assert burst.data["rate_limited"] == 50
    assert burst.data["unknown_token_refusals"] == 50
    assert burst.data["unknown_token_refusals_recorded"] == 20
    assert burst.data["unknown_token_refusals_unrecorded"] == 30
    assert burst.data["requests"] == 100
    assert burst.data["request_limit"] == 50
    assert burst.data["window_seconds"] == 60
    assert burst.data["window_start"] == "2027-01-15T08:00:00+00:00"
    assert burst.data["window_end"] == "2027-01-15T08:01:00+00:00"
    assert burst.data["key"] == "agent"
    # 20 refusals, one burst, and the new window's first refusal: 22 rows for 101 claims.
    assert AuditEvent.objects.filter(tenant=tenant).count() == 22
    # The reported window's counter row is gone; the new window's remains.
    assert list(RuntimeKeyUsage.objects.values_list("window_start", flat=True)) == [1_800_000_060]


def test_a_quiet_keys_burst_is_reported_once_by_the_beat_task(
    tenant: Tenant, runtime: Runtime, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 10
    settings.API_AUDITED_REFUSALS_PER_WINDOW = 3
    for n in range(15):
        runtime.claim(bogus_token(), f"exec-{n}")
    clock[0] = T0 + 29  # the window has not ended: nothing to report
    assert ratelimit.usage_report_closed() == 0

    clock[0] = T0 + 30
    assert ratelimit.usage_report_closed() == 1
    assert ratelimit.usage_report_closed() == 0

    (burst,) = events_of(runtime, ratelimit.BURST_EVENT)
    assert (burst.data["rate_limited"], burst.data["unknown_token_refusals_unrecorded"]) == (5, 7)
    assert burst.data["count"] == 12
    assert len(events_of(runtime, "claim.unknown_token")) == 3
    assert not RuntimeKeyUsage.objects.exists()


def test_a_window_without_a_burst_leaves_no_event(
    runtime: Runtime, clock: list[float], approved: str
) -> None:
    for _ in range(5):
        runtime.get(f"/api/v1/occurrences/{approved}")
    clock[0] = T0 + 60

    assert ratelimit.usage_report_closed() == 0
    assert not AuditEvent.objects.filter(kind=ratelimit.BURST_EVENT).exists()
    assert not RuntimeKeyUsage.objects.exists()


def test_refusals_that_name_a_real_approval_are_always_recorded(
    runtime: Runtime, token: str, clock: list[float], settings: Any
) -> None:
    # A runtime that spends the budget on bogus tokens cannot hide a replay behind it.
    settings.API_AUDITED_REFUSALS_PER_WINDOW = 5
    for n in range(10):
        runtime.claim(bogus_token(), f"bogus-{n}")
    assert runtime.claim(token, "exec-a").json()["decision"] == "approved"

    for n in range(3):
        replay = runtime.claim(token, f"thief-{n}")
        assert replay.json()["decision"] == "replayed"

    assert len(events_of(runtime, "claim.unknown_token")) == 5
    replays = events_of(runtime, "claim.replayed")
    assert sorted(e.execution_id for e in replays) == ["thief-0", "thief-1", "thief-2"]


def test_the_limit_comes_from_settings_unless_the_tenant_sets_its_own(
    tenant: Tenant, other_tenant: Tenant, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 3
    Tenant.objects.filter(pk=other_tenant.pk).update(api_rate_limit=5)
    default = make_runtime(tenant, "default-agent")
    own = make_runtime(other_tenant, "own-agent")

    assert [default.get("/api/v1/audit/events/cursor").status_code for _ in range(4)] == [
        200,
        200,
        200,
        429,
    ]
    assert [own.get("/api/v1/audit/events/cursor").status_code for _ in range(6)] == [
        200,
    ] * 5 + [429]


def test_each_key_has_its_own_limit(tenant: Tenant, clock: list[float], settings: Any) -> None:
    settings.API_RATE_LIMIT = 2
    first, second = make_runtime(tenant, "first"), make_runtime(tenant, "second")
    for _ in range(3):
        first.get("/api/v1/audit/events/cursor")

    assert first.get("/api/v1/audit/events/cursor").status_code == 429
    assert second.get("/api/v1/audit/events/cursor").status_code == 200


def test_a_new_window_admits_again(runtime: Runtime, clock: list[float], settings: Any) -> None:
    settings.API_RATE_LIMIT = 1
    assert runtime.get("/api/v1/audit/events/cursor").status_code == 200
    limited = runtime.get("/api/v1/audit/events/cursor")
    assert limited.status_code == 429

    clock[0] = T0 + int(limited["Retry-After"])

    assert runtime.get("/api/v1/audit/events/cursor").status_code == 200


def test_a_refused_request_writes_nothing(
    runtime: Runtime, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 1
    assert runtime.propose(client_ref="first").status_code == 201

    limited = runtime.propose(client_ref="second")

    assert limited.status_code == 429
    assert list(Occurrence.objects.values_list("client_ref", flat=True)) == ["first"]


def test_the_execution_endpoints_are_limited_too(
    runtime: Runtime, clock: list[float], settings: Any
) -> None:
    settings.API_RATE_LIMIT = 1
    missing = "00000000-0000-4000-8000-000000000000"
    assert runtime.get(f"/api/v1/commands/{missing}").status_code == 404

    assert runtime.get(f"/api/v1/commands/{missing}").status_code == 429


@pytest.mark.django_db(transaction=True)
def test_the_counter_is_exact_across_concurrent_connections(
    tenant: Tenant, clock: list[float], settings: Any
) -> None:
    """Eight threads, each with its own database connection (as eight web processes would
    have), admit 25 requests each against a limit of 50: exactly 50 are admitted."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (bin/test)")
    settings.API_RATE_LIMIT = 50
    key = make_runtime(tenant, "busy-agent").key
    barrier = threading.Barrier(8)
    admitted: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            barrier.wait()
            results = [ratelimit.request_admit(key).allowed for _ in range(25)]
            with lock:
                admitted.extend(results)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(admitted) == 200
    assert admitted.count(True) == 50
    assert RuntimeKeyUsage.objects.get(runtime_key=key).requests == 200
