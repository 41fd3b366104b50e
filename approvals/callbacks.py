"""Push: each decision on a runtime's request POSTed to the callback URL it registered.

A runtime key may register one callback URL (``PUT /api/v1/callback``); the answer carries
a signing secret, once. Every decision on an occurrence the key proposed (approved,
rejected, expired, edited) becomes a ``CallbackDelivery`` row in the transaction that
decided it (an outbox, written by ``services.audit_record``), and a Celery task POSTs it
after commit::

    POST <url>
    Content-Type: application/json
    X-Console-Delivery: <delivery id>           (the same on every retry: deduplicate on it)
    X-Console-Timestamp: <unix seconds>
    X-Console-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>

A 2xx answer delivers it. Anything else (another status, a timeout, a refused connection)
is recorded as an attempt and retried after 2, 4, 8 … seconds, up to
``CALLBACK_MAX_ATTEMPTS``; then the delivery is ``failed`` and the runtime is expected to
read the occurrence (``GET /api/v1/occurrences/{id}``), which holds the same facts.
Delivery is at least once: a worker that dies mid-call leaves the delivery leased, and
the sweep tries it again once the lease ran out.

The secret is stored encrypted (Fernet, a key derived from ``SECRET_KEY``): the console
must sign with it, so a hash would not do.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
import structlog
from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from approvals import broker, tokens
from approvals.errors import InputError
from approvals.models import (
    AuditEvent,
    CallbackAttempt,
    CallbackDelivery,
    Occurrence,
    RuntimeCallback,
    RuntimeKey,
)
from approvals.vocabulary import AuditKind

log = structlog.get_logger("approvals.callbacks")

# Audit kinds that are decisions a waiting runtime wants to hear of, and how the
# callback's body names them.
EVENTS: dict[str, str] = {
    AuditKind.APPROVAL_ISSUED: "approved",
    AuditKind.OCCURRENCE_REJECTED: "rejected",
    AuditKind.APPROVAL_EXPIRED: "expired",
    AuditKind.PROPOSAL_EDITED: "edited",
}
LEASE = timedelta(seconds=60)
SIGNATURE_HEADER = "X-Console-Signature"
TIMESTAMP_HEADER = "X-Console-Timestamp"
DELIVERY_HEADER = "X-Console-Delivery"


# --- the secret ---------------------------------------------------------------------------


def _fernet() -> Fernet:
    key = hashlib.sha256(b"approval-console callback secrets:" + settings.SECRET_KEY.encode())
    return Fernet(base64.urlsafe_b64encode(key.digest()))


def _decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        return ""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header's value: what a receiver recomputes to check a delivery."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


# --- registering --------------------------------------------------------------------------


def _check_url(url: str) -> str:
    url = (url or "").strip()
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise InputError(
            "invalid_url", "The callback URL may hold no spaces or control characters.", "url"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InputError("invalid_url", "The callback URL must be an http(s) URL.", "url")
    if parts.username or parts.password:
        raise InputError("invalid_url", "Put no credentials in the callback URL.", "url")
    if parts.scheme == "http" and not settings.CALLBACK_ALLOW_HTTP:
        raise InputError(
            "https_required",
            "The callback URL must use https (CALLBACK_ALLOW_HTTP is off).",
            "url",
        )
    if not settings.CALLBACK_ALLOW_PRIVATE_HOSTS and _is_private(parts.hostname):
        raise InputError(
            "private_host",
            "The callback URL names a loopback or private address, which this console "
            "does not call (CALLBACK_ALLOW_PRIVATE_HOSTS is off).",
            "url",
        )
    return url


def _is_private(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a name: resolved when called, where the network's rules apply
    return not address.is_global


@dataclass(frozen=True)
class Registered:
    callback: RuntimeCallback
    secret: str  # shown once: when the callback is first registered or its secret rotated


def callback_register(*, runtime_key: RuntimeKey, url: str, rotate: bool = False) -> Registered:
    """Register (or change) the key's callback URL. A new registration, or ``rotate``,
    mints a new signing secret and returns it; changing only the URL keeps the secret."""
    url = _check_url(url)
    with transaction.atomic():
        existing = (
            RuntimeCallback.objects.select_for_update().filter(runtime_key=runtime_key).first()
        )
        secret = ""
        if existing is None or rotate:
            secret = tokens.mint(tokens.CALLBACK_SECRET_PREFIX)
        if existing is None:
            callback = RuntimeCallback.objects.create(
                runtime_key=runtime_key,
                url=url,
                secret_encrypted=_fernet().encrypt(secret.encode()).decode(),
            )
        else:
            existing.url = url
            existing.is_active = True
            fields = ["url", "is_active", "updated_at"]
            if secret:
                existing.secret_encrypted = _fernet().encrypt(secret.encode()).decode()
                fields.append("secret_encrypted")
            existing.save(update_fields=fields)
            callback = existing
        from approvals.services import audit_record

        audit_record(
            kind=AuditKind.CALLBACK_REGISTERED,
            tenant=runtime_key.tenant_id,
            actor=runtime_key.actor,
            data={"url": url, "secret_rotated": bool(secret)},
        )
    return Registered(callback, secret)


def callback_remove(*, runtime_key: RuntimeKey) -> bool:
    with transaction.atomic():
        changed = RuntimeCallback.objects.filter(runtime_key=runtime_key, is_active=True).update(
            is_active=False, updated_at=timezone.now()
        )
        if changed:
            from approvals.services import audit_record

            audit_record(
                kind=AuditKind.CALLBACK_REMOVED,
                tenant=runtime_key.tenant_id,
                actor=runtime_key.actor,
            )
    return bool(changed)


# --- the outbox ---------------------------------------------------------------------------


def delivery_create(event: AuditEvent) -> CallbackDelivery | None:
    """Called by ``services.audit_record`` for a decision event, inside the deciding
    transaction: a delivery row for the proposing key's callback, if it has one."""
    name = EVENTS.get(event.kind)
    if name is None or event.occurrence_id is None:
        return None
    found = (
        Occurrence.objects.filter(pk=event.occurrence_id)
        .values_list(
            "runtime_key__callback__pk",
            "runtime_key__callback__is_active",
            "run_id",
            "client_ref",
            "status",
        )
        .first()
    )
    if found is None or found[0] is None or not found[1]:
        return None
    callback_id, _, run_id, client_ref, status = found
    delivery_id = uuid.uuid4()
    body = {
        "delivery_id": str(delivery_id),
        "event": name,
        "occurrence_id": str(event.occurrence_id),
        "run_id": run_id,
        "client_ref": client_ref,
        "status": status,
        "decided_by": event.actor,
        "occurred_at": event.source_time.isoformat() if event.source_time else None,
        "details": {
            k: v
            for k, v in (event.data or {}).items()
            if k in ("reason", "version", "expires_at", "to_version")
        },
    }
    delivery = CallbackDelivery.objects.create(
        id=delivery_id,
        callback_id=callback_id,
        occurrence_id=event.occurrence_id,
        event=name,
        body=body,
        next_attempt_at=timezone.now(),
    )
    transaction.on_commit(lambda: enqueue(delivery_id))
    return delivery


def enqueue(delivery_id: uuid.UUID, *, countdown: float | None = None) -> bool:
    """Publish the delivery's task; False (logged) if the broker cannot be reached, in which
    case the sweep (``callbacks_sweep``, Celery beat) sends it later."""
    from approvals.tasks import callback_deliver

    try:
        broker.publish(callback_deliver, (str(delivery_id),), countdown=countdown)
    except Exception:  # the broker's failures are many; none may fail the caller
        log.exception("callback.enqueue_failed", delivery_id=str(delivery_id))
        return False
    return True


# --- delivering ---------------------------------------------------------------------------


def _backoff(attempts: int) -> timedelta:
    return timedelta(seconds=settings.CALLBACK_RETRY_BACKOFF_SECONDS * 2 ** max(attempts - 1, 0))


def deliver(delivery_id: str) -> str:
    """One attempt at one delivery, if it is due and nobody else holds it. Returns what
    happened: delivered, retry, failed, or skipped (not due, leased, already done)."""
    now = timezone.now()
    leased = CallbackDelivery.objects.filter(
        Q(leased_until__isnull=True) | Q(leased_until__lt=now),
        pk=delivery_id,
        state=CallbackDelivery.State.PENDING,
        next_attempt_at__lte=now,
    ).update(leased_until=now + LEASE)
    if not leased:
        return "skipped"
    delivery = CallbackDelivery.objects.select_related("callback").get(pk=delivery_id)
    callback = delivery.callback
    number = delivery.attempts + 1
    body = json.dumps(delivery.body, separators=(",", ":"), sort_keys=True).encode()
    timestamp = str(int(time.time()))
    status_code: int | None = None
    error = ""
    started = timezone.now()
    secret = _decrypt(callback.secret_encrypted)
    if not callback.is_active:
        error = "the callback was removed"
    elif not secret:
        error = "the signing secret no longer decrypts (SECRET_KEY changed): register again"
    else:
        try:
            response = httpx.post(
                callback.url,
                content=body,
                headers={
                    "Content-Type": "application/json",
                    DELIVERY_HEADER: str(delivery.pk),
                    TIMESTAMP_HEADER: timestamp,
                    SIGNATURE_HEADER: sign(secret, timestamp, body),
                    "User-Agent": "approval-console-callbacks/1",
                },
                timeout=httpx.Timeout(
                    settings.ADAPTER_READ_TIMEOUT, connect=settings.ADAPTER_CONNECT_TIMEOUT
                ),
                follow_redirects=False,
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
        enqueue(delivery.pk, countdown=_backoff(number).total_seconds())
    return outcome


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
    the timestamp is recent. Used by the tests as the receiver's own check."""
    timestamp = headers.get(TIMESTAMP_HEADER, "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), headers.get(SIGNATURE_HEADER, ""))


def summary(callback: RuntimeCallback) -> dict[str, int]:
    """The callback's deliveries by state, in one query."""
    counts = dict.fromkeys(CallbackDelivery.State.values, 0)
    rows = (
        CallbackDelivery.objects.filter(callback=callback)
        .values_list("state")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for state, n in rows:
        counts[state] = n
    return counts
