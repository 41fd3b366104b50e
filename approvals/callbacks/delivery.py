"""Delivering a callback: one signed POST per attempt, retried with backoff up to
``CALLBACK_MAX_ATTEMPTS`` by the outbox mechanism callbacks share with notifications
(``approvals.outbound.outbox``); a worker that dies mid-call leaves the delivery leased,
and the sweep tries it again once the lease ran out."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import httpx
import structlog
from django.conf import settings

from approvals.callbacks.registry import secret_decrypt
from approvals.models import (
    CallbackAttempt,
    CallbackDelivery,
)
from approvals.outbound import signing
from approvals.outbound.client import outbound_client
from approvals.outbound.outbox import Attempt, Sent, attempt_once, rows_due

log = structlog.get_logger("approvals.callbacks")


SIGNATURE_HEADER = "X-Console-Signature"


TIMESTAMP_HEADER = "X-Console-Timestamp"


DELIVERY_HEADER = "X-Console-Delivery"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``X-Console-Signature``'s value, the console's own signature from before Standard
    Webhooks: still sent, so receivers that check it keep working."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _headers(secret: str, delivery_id: str, timestamp: str, body: bytes) -> dict[str, str]:
    """Both signatures: Standard Webhooks' (``webhook-*``, the delivery id as the message
    id) and the console's older ``X-Console-*``, over the same body and time."""
    return {
        "Content-Type": "application/json",
        "User-Agent": "approval-console-callbacks/1",
        DELIVERY_HEADER: delivery_id,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(secret, timestamp, body),
        **signing.signed_headers(
            secret=secret, message_id=delivery_id, timestamp=int(timestamp), body=body
        ),
    }


def _send(delivery: CallbackDelivery) -> Sent:
    """One signed POST of a delivery to its callback's URL."""
    callback = delivery.callback
    if not callback.is_active:
        return Sent(error="the callback was removed", give_up=True)
    secret = secret_decrypt(callback.secret_encrypted)
    if not secret:
        return Sent(
            error="the signing secret no longer decrypts (SECRET_KEY changed and the old "
            "key is not in SECRET_KEY_FALLBACKS): register again"
        )
    body = json.dumps(delivery.body, separators=(",", ":"), sort_keys=True).encode()
    timestamp = str(int(time.time()))
    try:
        # Connected only to a public address unless the operator allows private ones,
        # checked on the address the connection reaches (a name may resolve elsewhere
        # now than at registration); bounded in time and in the answer's size.
        public_only = not settings.CALLBACK_ALLOW_PRIVATE_HOSTS
        with outbound_client(public_only=public_only) as client:
            response = client.post(
                callback.url,
                content=body,
                headers=_headers(secret, str(delivery.pk), timestamp, body),
            )
    except httpx.HTTPError as exc:
        return Sent(error=f"{type(exc).__name__}: {exc}"[:500])
    code = response.status_code
    return Sent(code, "" if 200 <= code < 300 else f"HTTP {code}")


def deliver(delivery_id: str) -> Attempt:
    """One attempt at one delivery, if it is due and nobody else holds it (the shared
    outbox mechanism of ``approvals.outbound.outbox``). Whoever called publishes the retry
    (``approvals.callbacks.tasks``)."""
    return attempt_once(
        rows=CallbackDelivery,
        attempts=CallbackAttempt,
        pk=delivery_id,
        send=_send,
        max_attempts=settings.CALLBACK_MAX_ATTEMPTS,
        backoff_seconds=settings.CALLBACK_RETRY_BACKOFF_SECONDS,
        related=("callback",),
    )


def deliveries_due(limit: int = 500) -> list[str]:
    """Pending deliveries whose time has come and that nobody holds: those whose task was
    lost (a broker that was down at commit, a worker that died mid-call)."""
    return rows_due(
        CallbackDelivery, grace_seconds=settings.CALLBACK_SWEEP_GRACE_SECONDS, limit=limit
    )


def receiver_check(
    secret: str, headers: dict[str, str], body: bytes, *, tolerance: int = 300
) -> bool:
    """What a receiver does, in Python (the README shows it): the signature matches and
    the timestamp is recent. Used by the tests as the receiver's own check.

    A delivery with Standard Webhooks headers is checked by the ``standardwebhooks``
    package alone (its tolerance is five minutes); one without them (a sender from before
    them) by ``X-Console-Signature`` and ``tolerance`` seconds."""
    if any(name.lower() == signing.SIGNATURE_HEADER for name in headers):
        return signing.verify(secret=secret, headers=headers, body=body)
    timestamp = headers.get(TIMESTAMP_HEADER, "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), headers.get(SIGNATURE_HEADER, ""))
