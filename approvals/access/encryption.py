"""Secrets the console must read back (a callback's signing secret, an adapter's API key, a
webhook's signing secret), encrypted at rest with Fernet under keys derived from Django's
``SECRET_KEY``.

Encrypted with the current ``SECRET_KEY`` and read with it or any of
``SECRET_KEY_FALLBACKS`` (``MultiFernet``), so rotating the secret key the way Django
documents it (the new key in ``SECRET_KEY``, the old one moved into
``SECRET_KEY_FALLBACKS``) keeps every stored secret readable. ``secret_reencrypt`` moves a
stored value onto the current key (``manage.py reencrypt_secrets`` does it for every
stored secret), after which the old key can leave the fallbacks.

Each purpose derives keys of its own from the secret key: a value encrypted for one
purpose does not decrypt as another's. The derivations are those the console has always
used, so values stored before this module existed read as before.
"""

from __future__ import annotations

import base64
import hashlib
from enum import StrEnum

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class Purpose(StrEnum):
    CALLBACK_SECRETS = "callback secrets"
    ADAPTER_CREDENTIALS = "adapter credentials"
    # A reviewer group's Slack webhook URL and generic webhook signing secret.
    NOTIFICATION_SECRETS = "notification secrets"
    # A runtime key on its way from the POST that created it to the page that shows it
    # once (the session holds it for that redirect only, never in the clear).
    KEY_HANDOFF = "runtime key handoff"
    # A reviewer group's new webhook signing secret, on its way to the routing page in
    # the same way.
    WEBHOOK_SECRET_HANDOFF = "webhook secret handoff"


def _fernet(secret_key: str | bytes, purpose: Purpose) -> Fernet:
    raw = secret_key if isinstance(secret_key, bytes) else secret_key.encode()
    digest = hashlib.sha256(f"approval-console {purpose}:".encode() + raw).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _keys(purpose: Purpose) -> MultiFernet:
    # Read on every call, not once: the settings may change under a running test, and
    # deriving a key is one SHA-256.
    secret_keys = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    return MultiFernet([_fernet(key, purpose) for key in secret_keys])


def secret_encrypt(plaintext: str, *, purpose: Purpose) -> str:
    """The stored form of ``plaintext``: encrypted with the current ``SECRET_KEY``."""
    return _keys(purpose).encrypt(plaintext.encode()).decode()


def secret_decrypt(stored: str, *, purpose: Purpose, ttl: int | None = None) -> str:
    """The secret, read with the current key or a fallback; "" when no key reads it (the
    key it was encrypted with is neither ``SECRET_KEY`` nor in ``SECRET_KEY_FALLBACKS``),
    or when it was encrypted more than ``ttl`` seconds ago, which the callers report as a
    missing secret."""
    try:
        return _keys(purpose).decrypt(stored.encode(), ttl=ttl).decode()
    except InvalidToken:
        return ""


def secret_reencrypt(stored: str, *, purpose: Purpose) -> str | None:
    """``stored`` encrypted again with the current key (None when no key reads it)."""
    try:
        return _keys(purpose).rotate(stored.encode()).decode()
    except InvalidToken:
        return None
