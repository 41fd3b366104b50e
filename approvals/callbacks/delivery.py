"""Delivering a callback: one signed POST per attempt, retried with backoff up to
``CALLBACK_MAX_ATTEMPTS``; a worker that dies mid-call leaves the delivery leased, and the
sweep tries it again once the lease ran out."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import timedelta
from typing import NamedTuple

import httpx
import structlog
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals.callbacks.registry import secret_decrypt
from approvals.models import (
    CallbackAttempt,
    CallbackDelivery,
)
from approvals.outbound import signing
from approvals.outbound.client import outbound_client

log = structlog.get_logger("approvals.callbacks")


LEASE = timedelta(seconds=60)


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


def _backoff(attempts: int) -> timedelta:
    return timedelta(seconds=settings.CALLBACK_RETRY_BACKOFF_SECONDS * 2 ** max(attempts - 1, 0))


class Attempt(NamedTuple):
    """What one attempt did: ``outcome`` is delivered, retry, failed, or skipped (not due,
    leased, already done); ``retry_in``, for a retry, the seconds until the next one."""

    outcome: str
    retry_in: float | None = None


def deliver(delivery_id: str) -> Attempt:
    """One attempt at one delivery, if it is due and nobody else holds it. Whoever called
    publishes the retry (``approvals.callbacks.tasks``)."""
    now = timezone.now()
    leased = CallbackDelivery.objects.filter(
        Q(leased_until__isnull=True) | Q(leased_until__lt=now),
        pk=delivery_id,
        state=CallbackDelivery.State.PENDING,
        next_attempt_at__lte=now,
    ).update(leased_until=now + LEASE)
    if not leased:
        return Attempt("skipped")
    delivery = CallbackDelivery.objects.select_related("callback").get(pk=delivery_id)
    callback = delivery.callback
    number = delivery.attempts + 1
    body = json.dumps(delivery.body, separators=(",", ":"), sort_keys=True).encode()
    timestamp = str(int(time.time()))
    status_code: int | None = None
    error = ""
    started = timezone.now()
    secret = secret_decrypt(callback.secret_encrypted)
    if not callback.is_active:
        error = "the callback was removed"
    elif not secret:
        error = (
            "the signing secret no longer decrypts (SECRET_KEY changed and the old key is "
            "not in SECRET_KEY_FALLBACKS): register again"
        )
    else:
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
            status_code = response.status_code
            if not 200 <= status_code < 300:
                error = f"HTTP {status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
    finished = timezone.now()
    delivered = not error
    final = delivered or number >= settings.CALLBACK_MAX_ATTEMPTS or not callback.is_active
    with transaction.atomic():
        CallbackAttempt.objects.create(
            delivery=delivery,
            number=number,
            started_at=started,
            finished_at=finished,
            status_code=status_code,
            error=error,
        )
        state = (
            CallbackDelivery.State.DELIVERED
            if delivered
            else (CallbackDelivery.State.FAILED if final else CallbackDelivery.State.PENDING)
        )
        CallbackDelivery.objects.filter(pk=delivery.pk).update(
            attempts=number,
            state=state,
            leased_until=None,
            delivered_at=finished if delivered else None,
            next_attempt_at=finished if final else finished + _backoff(number),
            last_error=error,
        )
    outcome = "delivered" if delivered else ("failed" if final else "retry")
    log.info(
        "callback.attempt",
        delivery_id=str(delivery.pk),
        attempt=number,
        status_code=status_code,
        outcome=outcome,
    )
    if outcome == "retry":
        return Attempt(outcome, _backoff(number).total_seconds())
    return Attempt(outcome)


def deliveries_due(limit: int = 500) -> list[str]:
    """Pending deliveries whose time has come and that nobody holds: those whose task was
    lost (a broker that was down at commit, a worker that died mid-call)."""
    now = timezone.now()
    return [
        str(pk)
        for pk in CallbackDelivery.objects.filter(
            Q(leased_until__isnull=True) | Q(leased_until__lt=now),
            state=CallbackDelivery.State.PENDING,
            next_attempt_at__lte=now - timedelta(seconds=settings.CALLBACK_SWEEP_GRACE_SECONDS),
        )
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    ]


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
