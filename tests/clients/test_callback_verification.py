"""The Python client's receiver check (``approval_console.callbacks.verify_callback``)
accepts what the console sends: the Standard Webhooks signature, checked against the
``standardwebhooks`` package's own, and the older X-Console-Signature, for secrets of
either spelling; a tampered, stale or foreign delivery is refused."""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from approval_console.callbacks import verify_callback
from standardwebhooks import Webhook

from approvals.callbacks.delivery import deliver
from approvals.callbacks.registry import secret_encrypt
from approvals.models import CallbackDelivery, RuntimeCallback
from tests.conftest import Runtime, approve

BODY = b'{"event":"approved","occurrence_id":"o-1"}'
NEW_SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def standard_headers(secret: str, sent_at: float, body: bytes = BODY) -> dict[str, str]:
    moment = datetime.fromtimestamp(int(sent_at), tz=UTC)
    return {
        "webhook-id": "d-1",
        "webhook-timestamp": str(int(sent_at)),
        "webhook-signature": Webhook(secret).sign("d-1", moment, body),
    }


def test_a_standard_signature_made_by_the_package_verifies() -> None:
    headers = standard_headers(NEW_SECRET, time.time())

    assert verify_callback(NEW_SECRET, headers, BODY)
    assert verify_callback(NEW_SECRET, {k.title(): v for k, v in headers.items()}, BODY)
    assert not verify_callback(NEW_SECRET, headers, BODY.replace(b"approved", b"rejected"))
    other = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    assert not verify_callback(other, headers, BODY)


def test_a_stale_delivery_is_refused() -> None:
    headers = standard_headers(NEW_SECRET, time.time() - 301)

    assert not verify_callback(NEW_SECRET, headers, BODY)
    assert verify_callback(NEW_SECRET, headers, BODY, tolerance=600)


@pytest.fixture
def received() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    got: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            got.append((dict(self.headers.items()), body))
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", got
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("spelling", ["standard", "url-safe"])
def test_what_the_console_sends_verifies_with_the_secret_it_showed(
    runtime: Runtime,
    reviewer: Any,
    settings: Any,
    received: tuple[str, list[tuple[dict[str, str], bytes]]],
    spelling: str,
) -> None:
    settings.CALLBACK_ALLOW_HTTP = settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    url, got = received
    put = runtime.client.put(
        "/api/v1/callback", json.dumps({"url": url}), content_type="application/json"
    )
    secret = put.json()["secret"]
    if spelling == "url-safe":  # registered before Standard Webhooks
        while not {"-", "_"} & set(secret := "whsec_" + secrets.token_urlsafe(32)):
            pass
        RuntimeCallback.objects.update(secret_encrypted=secret_encrypt(secret))
    approve(runtime.propose().json()["occurrence_id"], reviewer)
    deliver(str(CallbackDelivery.objects.get().pk))

    ((headers, body),) = got
    assert verify_callback(secret, headers, body)
    older = {k: v for k, v in headers.items() if not k.lower().startswith("webhook-")}
    assert verify_callback(secret, older, body)
    assert not verify_callback(secret, older, body + b" ")
