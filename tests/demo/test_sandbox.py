"""The sandbox payments service, exercised as a real process over real HTTP."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from tests.demo import sandbox_fixture
from tests.demo.sandbox_fixture import WEBHOOK_SECRET, SandboxProcess, start_sandbox

pytestmark = pytest.mark.slow  # a sandbox process per test, some killed and restarted

# Imported under its own name so every test here can ask for it.
sandbox_server = sandbox_fixture.sandbox_server

WWW_AUTHENTICATE = 'Bearer realm="payments", error="invalid_token"'
REFUND = {"payment_id": "pay_123", "amount_minor": 8000, "currency": "EUR", "reason": "Damaged"}
TIMEOUT = httpx.Timeout(5.0, connect=2.0)
# What an adapter sees when the remote answers nothing: the read timeout fires.
SHORT_READ = httpx.Timeout(5.0, connect=2.0, read=1.0)
# What an adapter sees when the connection is dropped mid-request.
DROPPED_ERRORS = (httpx.ReadError, httpx.RemoteProtocolError)


@pytest.fixture
def api(sandbox_server: SandboxProcess) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=sandbox_server.url,
        timeout=TIMEOUT,
        headers={"Authorization": f"Bearer {sandbox_server.api_key}"},
    ) as client:
        yield client


def refund(
    client: httpx.Client, key: str | None = "key-1", body: dict[str, Any] | None = None
) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post("/v1/refunds", json=REFUND if body is None else body, headers=headers)


def message(
    client: httpx.Client,
    text: str = "hello",
    key: str = "msg-key",
    *,
    secret: str = WEBHOOK_SECRET,
    sent_at: datetime | None = None,
) -> httpx.Response:
    """A message signed as Standard Webhooks signs one, by the package itself."""
    # Bytes, not json=: the test checks that the receiver keeps exactly what was sent.
    body = b'{"text": "%s"}' % text.encode()
    sent_at = sent_at or datetime.now(UTC)
    return client.post(
        "/v1/messages",
        content=body,
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": key,
            "X-Signature": "sha256=abc",
            "webhook-id": key,
            "webhook-timestamp": str(int(sent_at.timestamp())),
            "webhook-signature": Webhook(secret).sign(key, sent_at, body),
        },
    )


def log(sandbox: SandboxProcess) -> list[tuple[str, str, str | None, int | str | None]]:
    return [(r["method"], r["path"], r["idempotency_key"], r["status"]) for r in sandbox.requests()]


# -- refunds -------------------------------------------------------------------------------


def test_create_answers_201_with_the_refund(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    response = refund(api)

    assert response.status_code == 201
    body = response.json()
    assert body["id"].startswith("re_")
    assert {k: body[k] for k in ("payment_id", "amount_minor", "currency", "status")} == {
        "payment_id": "pay_123",
        "amount_minor": 8000,
        "currency": "EUR",
        "status": "succeeded",
    }
    assert body["idempotency_key"] == "key-1"
    assert body["created_at"]
    assert sandbox_server.refunds() == [body]


def test_same_key_same_body_returns_the_first_refund_and_creates_nothing(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    first = refund(api)
    # Same fields in another order: the same request.
    again = refund(api, body=dict(reversed(list(REFUND.items()))))

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert len(sandbox_server.refunds()) == 1


def test_same_key_different_body_is_409_and_creates_nothing(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    refund(api)

    response = refund(api, body={**REFUND, "amount_minor": 9000})

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert len(sandbox_server.refunds()) == 1


def test_bad_requests_are_400_and_create_nothing(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    cases: list[tuple[str | None, dict[str, Any], str]] = [
        (None, REFUND, "idempotency_key_required"),
        ("k", {**REFUND, "amount_minor": "8000"}, "invalid_request"),
        ("k", {"payment_id": "pay_1"}, "invalid_request"),
    ]
    for key, body, code in cases:
        response = refund(api, key=key, body=body)

        assert response.status_code == 400
        assert response.json()["error"]["code"] == code
    assert sandbox_server.refunds() == []


def test_query_by_key_finds_the_refund_or_404(api: httpx.Client) -> None:
    created = refund(api).json()

    found = api.get("/v1/refunds", params={"idempotency_key": "key-1"})
    missing = api.get("/v1/refunds", params={"idempotency_key": "never-sent"})

    assert (found.status_code, found.json()) == (200, created)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_reversal_marks_the_refund_reversed_once(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    created = refund(api).json()

    first = api.post(f"/v1/refunds/{created['id']}/reversal")
    second = api.post(f"/v1/refunds/{created['id']}/reversal")
    unknown = api.post("/v1/refunds/re_nope/reversal")

    assert (first.status_code, second.status_code, unknown.status_code) == (200, 200, 404)
    assert first.json()["status"] == "reversed"
    assert first.json()["reversal_id"].startswith("rev_")
    assert second.json() == first.json()
    assert sandbox_server.refunds() == [first.json()]
    assert api.get("/v1/refunds", params={"idempotency_key": "key-1"}).json() == first.json()


def test_concurrent_requests_with_one_key_create_one_refund(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    barrier = threading.Barrier(8)
    statuses: list[int] = []

    def send() -> None:
        with httpx.Client(base_url=api.base_url, headers=api.headers, timeout=TIMEOUT) as own:
            barrier.wait()
            statuses.append(refund(own).status_code)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert Counter(statuses) == {201: 1, 200: 7}
    assert len(sandbox_server.refunds()) == 1


# -- messages ------------------------------------------------------------------------------


def test_messages_are_recorded_as_received_and_not_deduped(
    sandbox_server: SandboxProcess,
) -> None:
    # No bearer key: a webhook receiver authenticates by the signature it records.
    with httpx.Client(base_url=sandbox_server.url, timeout=TIMEOUT) as client:
        first = message(client)
        second = message(client)

    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["id"].startswith("msg_")
    assert first.json()["id"] != second.json()["id"]
    held = sandbox_server.messages()
    assert [m["id"] for m in held] == [first.json()["id"], second.json()["id"]]
    assert held[0]["body"] == {"text": "hello"}
    assert held[0]["raw_body"] == '{"text": "hello"}'
    assert (held[0]["idempotency_key"], held[0]["signature"]) == ("msg-key", "sha256=abc")
    assert held[0]["webhook_id"] == "msg-key"


@pytest.mark.parametrize(
    ("secret", "age", "why"),
    [
        ("whsec_" + "A" * 43 + "=", timedelta(0), "No matching signature found"),
        (WEBHOOK_SECRET, timedelta(minutes=6), "Message timestamp too old"),
        (WEBHOOK_SECRET, timedelta(minutes=-6), "Message timestamp too new"),
    ],
    ids=["another-secret", "replayed-later", "from-the-future"],
)
def test_a_message_whose_signature_does_not_verify_is_refused(
    sandbox_server: SandboxProcess, secret: str, age: timedelta, why: str
) -> None:
    with httpx.Client(base_url=sandbox_server.url, timeout=TIMEOUT) as client:
        refused = message(client, secret=secret, sent_at=datetime.now(UTC) - age)
        unsigned = client.post("/v1/messages", content=b"{}", headers={"X-Signature": "x"})

    assert refused.status_code == 401
    assert refused.json()["error"] == {"code": "invalid_signature", "message": why}
    assert unsigned.status_code == 401
    assert sandbox_server.messages() == []


# -- auth ----------------------------------------------------------------------------------


def test_wrong_or_missing_key_is_401_with_the_challenge_before_any_effect(
    sandbox_server: SandboxProcess,
) -> None:
    for authorization in (None, "Bearer sk_wrong", "Basic c2tfc2FuZGJveF90ZXN0Og==", "Bearer"):
        headers = {} if authorization is None else {"Authorization": authorization}
        with httpx.Client(base_url=sandbox_server.url, timeout=TIMEOUT, headers=headers) as client:
            create = refund(client)
            query = client.get("/v1/refunds", params={"idempotency_key": "key-1"})

        for response in (create, query):
            assert response.status_code == 401, authorization
            assert response.headers["WWW-Authenticate"] == WWW_AUTHENTICATE
            assert response.json()["error"]["code"] == "invalid_token"
    assert sandbox_server.refunds() == []
    assert {r["status"] for r in sandbox_server.requests()} == {401}


# -- faults --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "status"), [("unauthorized", 401), ("unavailable", 503), ("declined", 402)]
)
def test_refusing_faults_answer_before_any_effect(
    sandbox_server: SandboxProcess, api: httpx.Client, mode: str, status: int
) -> None:
    sandbox_server.fault(mode, times=1)

    response = refund(api)

    assert response.status_code == status
    if mode == "unauthorized":
        assert response.headers["WWW-Authenticate"] == WWW_AUTHENTICATE
    assert sandbox_server.refunds() == []
    assert api.get("/v1/refunds", params={"idempotency_key": "key-1"}).status_code == 404
    assert sandbox_server.requests()[0]["fault"] == mode


def test_unauthorized_fault_applies_to_messages(sandbox_server: SandboxProcess) -> None:
    sandbox_server.fault("unauthorized", times=1)

    with httpx.Client(base_url=sandbox_server.url, timeout=TIMEOUT) as client:
        refused = message(client)
        accepted = message(client)

    assert refused.status_code == 401
    assert refused.headers["WWW-Authenticate"] == WWW_AUTHENTICATE
    assert accepted.status_code == 202
    assert [m["id"] for m in sandbox_server.messages()] == [accepted.json()["id"]]


def test_timeout_after_effect_creates_the_refund_then_holds_the_answer(
    sandbox_server: SandboxProcess,
) -> None:
    sandbox_server.fault("timeout_after_effect", times=1)
    headers = {"Authorization": f"Bearer {sandbox_server.api_key}"}

    with httpx.Client(base_url=sandbox_server.url, timeout=SHORT_READ, headers=headers) as client:
        with pytest.raises(httpx.ReadTimeout):
            refund(client)
        # While the answer is still held, the effect query already finds the refund.
        found = client.get("/v1/refunds", params={"idempotency_key": "key-1"})

    assert found.status_code == 200
    assert sandbox_server.refunds() == [found.json()]
    assert log(sandbox_server)[0] == ("POST", "/v1/refunds", "key-1", None)
    # Once the hold is over the answer is sent (to nobody) and logged.
    deadline = time.monotonic() + sandbox_server.hold_seconds + 3
    while log(sandbox_server)[0][3] is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox_server.requests()[0] == {
        "method": "POST",
        "path": "/v1/refunds",
        "idempotency_key": "key-1",
        "status": 201,
        "fault": "timeout_after_effect",
    }


def test_reset_after_effect_creates_the_refund_then_drops_the_connection(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    sandbox_server.fault("reset_after_effect", times=1)

    with pytest.raises(DROPPED_ERRORS):
        refund(api)

    assert len(sandbox_server.refunds()) == 1
    assert log(sandbox_server) == [("POST", "/v1/refunds", "key-1", "dropped")]
    # The same client carries on over a new connection.
    assert api.get("/v1/refunds", params={"idempotency_key": "key-1"}).status_code == 200


def test_reset_after_effect_records_the_message(sandbox_server: SandboxProcess) -> None:
    sandbox_server.fault("reset_after_effect", times=1)

    with (
        httpx.Client(base_url=sandbox_server.url, timeout=TIMEOUT) as client,
        pytest.raises(DROPPED_ERRORS),
    ):
        message(client)

    assert len(sandbox_server.messages()) == 1


def test_faults_count_down_over_writes_only(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    sandbox_server.fault("unavailable", times=2)

    statuses = [
        refund(api).status_code,
        # A read is not a write: it neither misbehaves nor uses up the fault.
        api.get("/v1/refunds", params={"idempotency_key": "key-1"}).status_code,
        refund(api).status_code,
        refund(api).status_code,
        refund(api).status_code,
    ]

    assert statuses == [503, 404, 503, 201, 200]
    assert len(sandbox_server.refunds()) == 1


def test_a_new_fault_replaces_the_pending_one_and_times_0_clears_it(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    sandbox_server.fault("unavailable", times=5)
    sandbox_server.fault("declined", times=1)
    assert refund(api).status_code == 402

    sandbox_server.fault("unavailable", times=5)
    sandbox_server.fault("unavailable", times=0)
    assert refund(api).status_code == 201


def test_unknown_fault_mode_is_400(sandbox_server: SandboxProcess) -> None:
    response = sandbox_server.client.post("/_sandbox/faults", json={"mode": "explode", "times": 1})

    assert response.status_code == 400


# -- the request log, reset, restart -------------------------------------------------------


def test_request_log_holds_every_v1_request_in_order_with_its_status(
    sandbox_server: SandboxProcess, api: httpx.Client
) -> None:
    refund(api)
    refund(api)
    refund(api, body={**REFUND, "amount_minor": 1})
    api.get("/v1/refunds", params={"idempotency_key": "key-1"})
    api.get("/v1/refunds", params={"idempotency_key": "key-2"})
    refund(api, key="key-2", body=REFUND)
    sandbox_server.fault("declined", times=1)
    refund(api, key="key-3")
    with httpx.Client(base_url=sandbox_server.url, timeout=TIMEOUT) as anonymous:
        refund(anonymous, key="key-4")
        message(anonymous, key="msg-1")

    assert log(sandbox_server) == [
        ("POST", "/v1/refunds", "key-1", 201),
        ("POST", "/v1/refunds", "key-1", 200),
        ("POST", "/v1/refunds", "key-1", 409),
        ("GET", "/v1/refunds", "key-1", 200),
        ("GET", "/v1/refunds", "key-2", 404),
        ("POST", "/v1/refunds", "key-2", 201),
        ("POST", "/v1/refunds", "key-3", 402),
        ("POST", "/v1/refunds", "key-4", 401),
        ("POST", "/v1/messages", "msg-1", 202),
    ]


def test_reset_clears_everything(sandbox_server: SandboxProcess, api: httpx.Client) -> None:
    refund(api)
    message(api)
    sandbox_server.fault("unavailable", times=3)

    sandbox_server.reset()

    assert sandbox_server.refunds() == []
    assert sandbox_server.messages() == []
    assert sandbox_server.requests() == []
    assert refund(api).status_code == 201


def test_state_survives_a_restart(sandbox_server: SandboxProcess) -> None:
    headers = {"Authorization": f"Bearer {sandbox_server.api_key}"}
    with httpx.Client(base_url=sandbox_server.url, timeout=TIMEOUT, headers=headers) as client:
        created = refund(client).json()
        message(client)
        sandbox_server.fault("unavailable", times=2)
        assert refund(client, key="key-2").status_code == 503
    before = sandbox_server.requests()

    assert sandbox_server.stop() == 0
    sandbox_server.start()

    with httpx.Client(base_url=sandbox_server.url, timeout=TIMEOUT, headers=headers) as client:
        assert sandbox_server.refunds() == [created]
        assert len(sandbox_server.messages()) == 1
        assert sandbox_server.requests() == before
        # The pending fault survived too: one use left.
        assert refund(client, key="key-2").status_code == 503
        replay = refund(client)
        assert (replay.status_code, replay.json()) == (200, created)
        assert refund(client, key="key-2").status_code == 201
    assert len(sandbox_server.refunds()) == 2


def test_state_survives_kill_9_and_a_held_request_is_logged_dropped(
    sandbox_server: SandboxProcess,
) -> None:
    sandbox_server.fault("timeout_after_effect", times=1)
    headers = {"Authorization": f"Bearer {sandbox_server.api_key}"}
    with (
        httpx.Client(base_url=sandbox_server.url, timeout=SHORT_READ, headers=headers) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        refund(client)

    sandbox_server.kill()
    sandbox_server.start()

    assert len(sandbox_server.refunds()) == 1
    assert log(sandbox_server) == [("POST", "/v1/refunds", "key-1", "dropped")]


def test_sigterm_during_a_held_answer_exits_cleanly_and_quickly(tmp_path: Path) -> None:
    with start_sandbox(tmp_path / "long-hold", hold_seconds=30) as sandbox:
        sandbox.fault("timeout_after_effect", times=1)
        headers = {"Authorization": f"Bearer {sandbox.api_key}"}
        with (
            httpx.Client(base_url=sandbox.url, timeout=SHORT_READ, headers=headers) as client,
            pytest.raises(httpx.ReadTimeout),
        ):
            refund(client)

        started = time.monotonic()
        assert sandbox.stop() == 0
        assert time.monotonic() - started < 5
