"""Secrets: minted from ``secrets``, stored only as SHA-256, compared in constant time."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

APPROVAL_TOKEN_PREFIX = "apv_"
RUNTIME_KEY_PREFIX = "rk_"
REVIEWER_TOKEN_PREFIX = "pat_"
CALLBACK_SECRET_PREFIX = "whsec_"

# Every kind of secret the console hands out, by the prefix it mints it with: whatever
# must never store one (the audit trail) refuses them all.
SECRET_PREFIXES = (
    APPROVAL_TOKEN_PREFIX,
    RUNTIME_KEY_PREFIX,
    REVIEWER_TOKEN_PREFIX,
    CALLBACK_SECRET_PREFIX,
)


def mint(prefix: str) -> str:
    # 32 random bytes: 256 bits of entropy, URL-safe.
    return prefix + secrets.token_urlsafe(32)


def mint_webhook_secret() -> str:
    """A callback's signing secret, spelled as Standard Webhooks spells one (``whsec_`` and
    standard base64 of 32 random bytes), so ``standardwebhooks.Webhook(secret)`` takes it
    as it is. Those minted before were ``whsec_`` and URL-safe base64; they keep working
    (``approvals.outbound.signing``)."""
    return CALLBACK_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def fingerprint(raw: str) -> str:
    """A short one-way name for a token, safe to print in logs and on pages."""
    return hashlib.sha256(b"fingerprint:" + raw.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def hashes_match(stored_hash: str, raw: str) -> bool:
    return hmac.compare_digest(stored_hash, hash_secret(raw))
