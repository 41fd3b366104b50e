"""Issue 23: a slow or huge receiver holds no worker. Every outbound call (callbacks, the
adapters, escalation) ends by its total deadline however its receiver dribbles, and reads
a bounded answer; real receivers on loopback do the dribbling."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from approvals.callbacks.delivery import deliver
from approvals.models import CallbackAttempt, CallbackDelivery
from approvals.outbound.client import ResponseTooLarge, outbound_client
from reconciliation.adapters.base import Call, Unknown
from reconciliation.adapters.payments import PaymentsAdapter
from tests.approvals.receivers import Receiver, dribble, flood
from tests.conftest import Runtime, approve

# Headers that never end; a body that never ends; a huge body, declared or not.
DRIBBLED_HEADERS = dribble(b"HTTP/1.1 200 OK\r\nX-Slow: ")
DRIBBLED_BODY = dribble(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
HUGE_DECLARED = flood(b"HTTP/1.1 200 OK\r\nContent-Length: 419430400\r\n\r\n", 419430400)
HUGE_UNDECLARED = flood(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", 419430400)


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    server = Receiver(request.param)
    yield server
    server.close()


@pytest.fixture(autouse=True)
def bounds(settings: Any) -> None:
    settings.ADAPTER_CONNECT_TIMEOUT = 1.0
    settings.ADAPTER_READ_TIMEOUT = 1.0  # each dribbled byte comes well within it
    settings.OUTBOUND_DEADLINE_SECONDS = 2.0
    settings.OUTBOUND_MAX_RESPONSE_BYTES = 1024 * 1024
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    settings.CALLBACK_MAX_ATTEMPTS = 1


@pytest.mark.parametrize(
    "receiver", [DRIBBLED_HEADERS, DRIBBLED_BODY], indirect=True, ids=["headers", "body"]
)
def test_a_dribbling_callback_receiver_is_given_up_at_the_deadline(
    runtime: Runtime, reviewer: Any, receiver: Receiver
) -> None:
    put = runtime.client.put(
        "/api/v1/callback", json.dumps({"url": receiver.url}), content_type="application/json"
    )
    assert put.status_code == 200
    approve(runtime.propose().json()["occurrence_id"], reviewer)

    started = time.monotonic()
    outcome = deliver(str(CallbackDelivery.objects.get().pk)).outcome
    took = time.monotonic() - started

    assert outcome == "failed"
    assert 1.5 < took < 5, took
    (attempt,) = CallbackAttempt.objects.all()
    assert "ReadTimeout" in attempt.error and "deadline" in attempt.error


@pytest.mark.parametrize(
    "receiver", [HUGE_DECLARED, HUGE_UNDECLARED], indirect=True, ids=["declared", "undeclared"]
)
def test_a_huge_answer_is_not_read_past_the_cap(
    runtime: Runtime, reviewer: Any, receiver: Receiver
) -> None:
    runtime.client.put(
        "/api/v1/callback", json.dumps({"url": receiver.url}), content_type="application/json"
    )
    approve(runtime.propose().json()["occurrence_id"], reviewer)

    started = time.monotonic()
    assert deliver(str(CallbackDelivery.objects.get().pk)).outcome == "failed"

    assert time.monotonic() - started < 5
    (attempt,) = CallbackAttempt.objects.all()
    assert "ResponseTooLarge" in attempt.error and "1048576" in attempt.error


@pytest.mark.parametrize("receiver", [HUGE_UNDECLARED], indirect=True)
def test_the_client_raises_on_the_first_chunk_past_the_cap(receiver: Receiver) -> None:
    with outbound_client(public_only=False) as client, pytest.raises(ResponseTooLarge):
        client.post(receiver.url, content=b"{}")


@pytest.mark.parametrize("receiver", [DRIBBLED_BODY], indirect=True)
def test_an_adapter_call_to_a_dribbling_remote_is_unknown_by_the_deadline(
    receiver: Receiver,
) -> None:
    """The adapters share the client: a refund whose answer dribbles is an unknown
    outcome after the deadline, not a worker held for as long as the remote likes."""
    adapter = PaymentsAdapter(base_url=f"http://127.0.0.1:{receiver.port}", api_key="sk")
    call = Call(
        command_id="c1",
        idempotency_key="k1",
        tool="issue_refund",
        arguments={"payment_id": "p", "amount_minor": 1, "currency": "EUR"},
        tenant_id=1,
    )

    started = time.monotonic()
    result = adapter.execute(call)

    assert isinstance(result, Unknown), result
    assert time.monotonic() - started < 5
