"""Push callbacks: a runtime key registers one URL (``PUT /api/v1/callback``) and gets a
signing secret, once; the secret is stored encrypted, since the console must sign with it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from approvals.access import encryption, tokens
from approvals.errors import InputError
from approvals.models import (
    CallbackDelivery,
    RuntimeCallback,
    RuntimeKey,
)
from approvals.outbound.addresses import host_is_private
from approvals.vocabulary import AuditKind


def secret_encrypt(secret: str) -> str:
    return encryption.secret_encrypt(secret, purpose=encryption.Purpose.CALLBACK_SECRETS)


def secret_decrypt(stored: str) -> str:
    """The callback's signing secret, or "" when no secret key reads it any more."""
    return encryption.secret_decrypt(stored, purpose=encryption.Purpose.CALLBACK_SECRETS)


def _check_url(url: str, what: str = "callback") -> str:
    """The URL, stripped, or the InputError that names what is wrong with it (``what``
    names the URL in the messages: a callback's, a group's webhook)."""
    url = (url or "").strip()
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise InputError(
            "invalid_url", f"The {what} URL may hold no spaces or control characters.", "url"
        )
    unreadable = InputError(
        "invalid_url", f"The {what} URL cannot be read: check its host and port (1-65535).", "url"
    )
    try:
        url.encode("utf-8")
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except (ValueError, UnicodeError):
        # A malformed IPv6 literal, a port that is not a number or past 65535, a lone
        # surrogate: urlsplit raises ValueError (or UnicodeError) for each.
        raise unreadable from None
    if parts.scheme not in ("https", "http") or not host:
        raise InputError("invalid_url", f"The {what} URL must be an http(s) URL.", "url")
    if port == 0:
        raise InputError("invalid_url", f"The {what} URL's port must be 1-65535.", "url")
    if parts.username or parts.password:
        raise InputError("invalid_url", f"Put no credentials in the {what} URL.", "url")
    if parts.scheme == "http" and not settings.CALLBACK_ALLOW_HTTP:
        raise InputError(
            "https_required",
            f"The {what} URL must use https (CALLBACK_ALLOW_HTTP is off).",
            "url",
        )
    if not settings.CALLBACK_ALLOW_PRIVATE_HOSTS and host_is_private(host):
        raise InputError(
            "private_host",
            f"The {what} URL names or resolves to a loopback or private address, which "
            "this console does not call (CALLBACK_ALLOW_PRIVATE_HOSTS is off).",
            "url",
        )
    try:
        httpx.URL(url)  # what the worker will call: it must read the URL too
    except httpx.InvalidURL:
        raise unreadable from None
    return url


def url_check(url: str, *, what: str) -> str:
    """``_check_url`` for the other outbound URLs the console keeps (a reviewer group's
    Slack and generic webhooks): the same rules as a callback's."""
    return _check_url(url, what)


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
            secret = tokens.mint_webhook_secret()
        if existing is None:
            callback = RuntimeCallback.objects.create(
                runtime_key=runtime_key,
                url=url,
                secret_encrypted=secret_encrypt(secret),
            )
        else:
            existing.url = url
            existing.is_active = True
            fields = ["url", "is_active", "updated_at"]
            if secret:
                existing.secret_encrypted = secret_encrypt(secret)
                fields.append("secret_encrypted")
            existing.save(update_fields=fields)
            callback = existing
        from approvals.audit.record import audit_record

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
            from approvals.audit.record import audit_record

            audit_record(
                kind=AuditKind.CALLBACK_REMOVED,
                tenant=runtime_key.tenant_id,
                actor=runtime_key.actor,
            )
    return bool(changed)


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
