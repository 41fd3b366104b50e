"""Issue 8, push: each decision on a runtime's request is POSTed to its callback, signed,
retried with backoff, every attempt recorded; a real receiver checks the signature."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from standardwebhooks import Webhook, WebhookVerificationError

from approvals.callbacks.delivery import deliver, receiver_check
from approvals.callbacks.registry import secret_encrypt
from approvals.models import (
    AuditEvent,
    CallbackAttempt,
    CallbackDelivery,
    Occurrence,
    RuntimeCallback,
)
from approvals.outbound.signing import standard_secret
from approvals.reviews.decisions import occurrence_reject
from tests.conftest import Runtime, approve, make_runtime


@dataclass
class Receiver:
    """A real HTTP server on loopback: answers with the next scripted status, keeps what
    it was sent."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.received.append(({k: v for k, v in self.headers.items()}, body))
            status = state.statuses.pop(0) if state.statuses else 204
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/console"
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    settings.CALLBACK_RETRY_BACKOFF_SECONDS = 2.0


def register(runtime: Runtime, url: str, **extra: Any) -> Any:
    return runtime.client.put(
        "/api/v1/callback", json.dumps({"url": url, **extra}), content_type="application/json"
    )


def the_delivery(**filters: Any) -> CallbackDelivery:
    return CallbackDelivery.objects.get(**filters)


def test_registering_shows_the_secret_once(runtime: Runtime, receiver: Receiver) -> None:
    first = register(runtime, receiver.url)

    assert first.status_code == 200, first.content
    secret = first.json()["secret"]
    assert secret.startswith("whsec_")
    assert RuntimeCallback.objects.get().secret_encrypted != secret
    assert secret not in json.dumps(list(AuditEvent.objects.values("data")), default=str)
    read = runtime.get("/api/v1/callback")
    assert read.status_code == 200 and read.json()["secret"] is None
    assert read.json()["deliveries"] == {"pending": 0, "delivered": 0, "failed": 0}
    # Changing the URL keeps the secret; rotating mints a new one.
    assert register(runtime, receiver.url + "/v2").json()["secret"] is None
    rotated = register(runtime, receiver.url, rotate_secret=True).json()["secret"]
    assert rotated.startswith("whsec_") and rotated != secret


def test_an_approval_is_pushed_signed_and_recorded(
    runtime: Runtime, reviewer: Any, receiver: Receiver, django_capture_on_commit_callbacks: Any
) -> None:
    secret = register(runtime, receiver.url).json()["secret"]
    occurrence_id = runtime.propose(client_ref="call_7").json()["occurrence_id"]

    with django_capture_on_commit_callbacks(execute=False) as announced:
        approve(occurrence_id, reviewer)
    delivery = the_delivery(occurrence_id=occurrence_id)
    assert (delivery.event, delivery.state) == ("approved", "pending")
    assert announced  # the push is sent after commit, not before

    assert deliver(str(delivery.pk)).outcome == "delivered"

    ((headers, body),) = receiver.received
    # Standard Webhooks, checked by its reference implementation with the secret as given.
    assert Webhook(secret).verify(body, headers) == json.loads(body)
    assert headers["webhook-id"] == headers["X-Console-Delivery"] == str(delivery.pk)
    assert headers["webhook-timestamp"] == headers["X-Console-Timestamp"]
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "A" * 43 + "=").verify(body, headers)
    assert receiver_check(secret, headers, body)
    assert not receiver_check("whsec_wrong", headers, body)
    sent = json.loads(body)
    assert sent["event"] == "approved" and sent["status"] == "approved"
    assert (sent["occurrence_id"], sent["run_id"], sent["client_ref"]) == (
        occurrence_id,
        "run-1",
        "call_7",
    )
    assert sent["decided_by"] == "rita"
    delivery.refresh_from_db()
    assert delivery.state == "delivered" and delivery.attempts == 1
    (attempt,) = CallbackAttempt.objects.all()
    assert (attempt.number, attempt.status_code, attempt.error) == (1, 204, "")
    # Done is done: a second task for it calls nothing.
    assert deliver(str(delivery.pk)).outcome == "skipped"
    assert len(receiver.received) == 1


def old_headers(headers: dict[str, str]) -> dict[str, str]:
    """What a receiver written before Standard Webhooks looks at."""
    return {k: v for k, v in headers.items() if not k.lower().startswith("webhook-")}


def test_both_signatures_verify_and_a_tampered_body_fails_both(
    runtime: Runtime, reviewer: Any, receiver: Receiver
) -> None:
    secret = register(runtime, receiver.url).json()["secret"]
    approve(runtime.propose().json()["occurrence_id"], reviewer)
    deliver(str(CallbackDelivery.objects.get().pk))
    ((headers, body),) = receiver.received
    tampered = body.replace(b'"approved"', b'"rejected"')

    # A receiver from before Standard Webhooks checks X-Console-Signature as it did.
    assert receiver_check(secret, old_headers(headers), body)
    assert not receiver_check(secret, old_headers(headers), tampered)
    assert not receiver_check(secret, headers, tampered)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(tampered, headers)


def test_a_secret_registered_before_standard_webhooks_still_signs_both(
    runtime: Runtime, reviewer: Any, receiver: Receiver
) -> None:
    """Secrets were minted as whsec_ and URL-safe base64; the registered ones keep working:
    the old header as before, the standard one under the secret's standard spelling."""
    register(runtime, receiver.url)
    while not {"-", "_"} & set(old := "whsec_" + secrets.token_urlsafe(32)):
        pass  # one that standard base64 cannot read as it is
    RuntimeCallback.objects.update(secret_encrypted=secret_encrypt(old))
    approve(runtime.propose().json()["occurrence_id"], reviewer)

    assert deliver(str(CallbackDelivery.objects.get().pk)).outcome == "delivered"

    ((headers, body),) = receiver.received
    assert receiver_check(old, old_headers(headers), body)
    assert receiver_check(old, headers, body)
    spelled = standard_secret(old)
    assert (
        spelled == "whsec_" + old.removeprefix("whsec_").replace("-", "+").replace("_", "/") + "="
    )
    assert Webhook(spelled).verify(body, headers) == json.loads(body)


def test_a_rejection_carries_its_reason(
    runtime: Runtime, reviewer: Any, receiver: Receiver
) -> None:
    register(runtime, receiver.url)
    occurrence_id = runtime.propose().json()["occurrence_id"]
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id),
        reviewer=reviewer,
        reason="Refund already issued",
    )

    delivery = the_delivery(occurrence_id=occurrence_id)
    deliver(str(delivery.pk))

    sent = json.loads(receiver.received[0][1])
    assert sent["event"] == "rejected" and sent["status"] == "rejected"
    assert sent["details"]["reason"] == "Refund already issued"


def test_a_failing_receiver_is_retried_with_backoff_then_delivered(
    runtime: Runtime, reviewer: Any, receiver: Receiver
) -> None:
    register(runtime, receiver.url)
    receiver.statuses = [500, 503]
    occurrence_id = runtime.propose().json()["occurrence_id"]
    approve(occurrence_id, reviewer)
    delivery = the_delivery(occurrence_id=occurrence_id)

    def due_now() -> None:
        CallbackDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())

    assert deliver(str(delivery.pk)).outcome == "retry"
    delivery.refresh_from_db()
    wait = delivery.next_attempt_at - timezone.now()
    assert timedelta(seconds=1) < wait <= timedelta(seconds=2)
    # Not due yet: nothing is called.
    assert deliver(str(delivery.pk)).outcome == "skipped"
    due_now()
    assert deliver(str(delivery.pk)).outcome == "retry"
    delivery.refresh_from_db()
    assert delivery.next_attempt_at - timezone.now() > timedelta(seconds=3)  # doubled
    due_now()
    assert deliver(str(delivery.pk)).outcome == "delivered"

    attempts = list(CallbackAttempt.objects.values_list("number", "status_code", "error"))
    assert attempts == [(1, 500, "HTTP 500"), (2, 503, "HTTP 503"), (3, 204, "")]
    # The same delivery id every time: the receiver deduplicates on it.
    assert {h["X-Console-Delivery"] for h, _ in receiver.received} == {str(delivery.pk)}


def test_after_the_last_attempt_the_delivery_fails(
    runtime: Runtime, reviewer: Any, settings: Any
) -> None:
    settings.CALLBACK_MAX_ATTEMPTS = 2
    settings.ADAPTER_CONNECT_TIMEOUT = 0.5
    with socket_closed() as url:
        register(runtime, url)
        occurrence_id = runtime.propose().json()["occurrence_id"]
        approve(occurrence_id, reviewer)
        delivery = the_delivery(occurrence_id=occurrence_id)
        assert deliver(str(delivery.pk)).outcome == "retry"
        CallbackDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
        assert deliver(str(delivery.pk)).outcome == "failed"

    delivery.refresh_from_db()
    assert delivery.state == "failed" and delivery.attempts == 2
    assert "ConnectError" in delivery.last_error
    assert runtime.get("/api/v1/callback").json()["deliveries"]["failed"] == 1


def test_only_the_proposing_keys_callback_hears_of_its_requests(
    runtime: Runtime, reviewer: Any, receiver: Receiver
) -> None:
    other = make_runtime(runtime.key.tenant, "other-runtime")
    register(other, receiver.url)
    occurrence_id = runtime.propose().json()["occurrence_id"]

    approve(occurrence_id, reviewer)

    assert not CallbackDelivery.objects.exists()


def test_a_removed_callback_hears_of_nothing_more(
    runtime: Runtime, reviewer: Any, receiver: Receiver
) -> None:
    register(runtime, receiver.url)
    assert runtime.client.delete("/api/v1/callback").status_code == 204
    assert runtime.client.delete("/api/v1/callback").status_code == 404

    approve(runtime.propose().json()["occurrence_id"], reviewer)

    assert not CallbackDelivery.objects.exists()
    assert AuditEvent.objects.filter(kind="callback.removed").count() == 1


@pytest.mark.parametrize(
    ("url", "allow", "code"),
    [
        ("ftp://example.com/x", True, "invalid_url"),
        ("https://user:pw@example.com/x", True, "invalid_url"),
        ("https://example.com/a b", True, "invalid_url"),
        ("https://example.com/\x00", True, "nul_character"),  # the JSON parser's rule
        ("http://example.com/x", False, "https_required"),
        ("https://127.0.0.1:9/x", False, "private_host"),
        ("https://10.1.2.3/x", False, "private_host"),
        ("https://localhost/x", False, "private_host"),
    ],
)
def test_bad_urls_are_refused_and_nothing_is_registered(
    runtime: Runtime, settings: Any, url: str, allow: bool, code: str
) -> None:
    settings.CALLBACK_ALLOW_HTTP = allow
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = allow

    response = register(runtime, url)

    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] == code
    assert not RuntimeCallback.objects.exists()


def test_a_public_https_url_is_accepted_with_the_defaults(runtime: Runtime, settings: Any) -> None:
    settings.CALLBACK_ALLOW_HTTP = False
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = False

    assert register(runtime, "https://agents.example.com/console").status_code == 200


class socket_closed:
    """A loopback URL nobody listens on."""

    def __enter__(self) -> str:
        import socket

        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        return f"http://127.0.0.1:{port}/gone"

    def __exit__(self, *exc: Any) -> None:
        pass


# --- a real worker -------------------------------------------------------------------------

from tests.demo import sandbox_fixture  # noqa: E402
from tests.demo.sandbox_fixture import SandboxProcess  # noqa: E402
from tests.reconciliation import worker_fixture  # noqa: E402
from tests.reconciliation.worker_fixture import Broker, Workers, wait_until  # noqa: E402

broker = worker_fixture.broker
workers = worker_fixture.workers
sandbox_server = sandbox_fixture.sandbox_server


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a real worker shares PostgreSQL")
def test_a_real_worker_pushes_decisions_and_retries(
    runtime: Runtime,
    reviewer: Any,
    receiver: Receiver,
    broker: Broker,
    workers: Workers,
    sandbox_server: SandboxProcess,
) -> None:
    secret = register(runtime, receiver.url).json()["secret"]
    receiver.statuses = [502]
    workers.start(
        sandbox_server,
        CALLBACK_ALLOW_HTTP=1,
        CALLBACK_ALLOW_PRIVATE_HOSTS=1,
        CALLBACK_RETRY_BACKOFF_SECONDS=0.2,
    )
    occurrence_id = runtime.propose().json()["occurrence_id"]

    approve(occurrence_id, reviewer)

    wait_until(
        "the delivery to be delivered",
        lambda: the_delivery(occurrence_id=occurrence_id).state == "delivered",
        timeout=60,
    )
    assert [h["X-Console-Delivery"] for h, _ in receiver.received] == [
        str(the_delivery(occurrence_id=occurrence_id).pk)
    ] * 2
    assert all(receiver_check(secret, h, b) for h, b in receiver.received)
    for headers, body in receiver.received:
        Webhook(secret).verify(body, headers)
    assert list(CallbackAttempt.objects.values_list("status_code", flat=True)) == [502, 204]
