"""Checking a callback the console pushed to your URL (``PUT /api/v1/callback``).

The console signs each delivery twice, over the same body and time: as Standard Webhooks
signs (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``; the
``standardwebhooks`` package verifies them too) and with its older ``X-Console-*``
headers. ``verify_callback`` checks the Standard Webhooks signature when the delivery
carries one and the older one otherwise, and accepts the secret as the console showed it,
whichever base64 alphabet it was minted in::

    from approval_console.callbacks import verify_callback

    if not verify_callback(secret, request.headers, request.body):
        return 401
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

__all__ = ["signing_key", "verify_callback"]

PREFIX = "whsec_"
# Standard Webhooks' (and the console's) limit on how far a delivery's timestamp may be
# from the receiver's clock: a captured delivery replayed later is refused.
TOLERANCE_SECONDS = 300


def signing_key(secret: str) -> bytes:
    """The HMAC key of the Standard Webhooks signature: the base64 after ``whsec_``, in
    the standard or the URL-safe alphabet (secrets minted before were URL-safe); a secret
    that is not ``whsec_`` and base64 signs with its UTF-8 bytes."""
    if secret.startswith(PREFIX):
        encoded = secret.removeprefix(PREFIX).replace("-", "+").replace("_", "/")
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if key:
            return key
    return secret.encode()


def _recent(timestamp: str, tolerance: float, now: float) -> bool:
    return timestamp.isdigit() and abs(now - int(timestamp)) <= tolerance


def verify_callback(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """Whether ``body`` (the exact bytes received) was signed by the console with
    ``secret`` within ``tolerance`` seconds of ``now`` (the clock by default)."""
    fields = {name.lower(): value for name, value in headers.items()}
    now = time.time() if now is None else now
    if "webhook-signature" in fields:
        message_id = fields.get("webhook-id", "")
        timestamp = fields.get("webhook-timestamp", "")
        if not message_id or not _recent(timestamp, tolerance, now):
            return False
        signed = f"{message_id}.{timestamp}.".encode() + body
        digest = hmac.new(signing_key(secret), signed, hashlib.sha256).digest()
        expected = "v1," + base64.b64encode(digest).decode()
        return any(
            hmac.compare_digest(expected, given) for given in fields["webhook-signature"].split()
        )
    timestamp = fields.get("x-console-timestamp", "")
    if not _recent(timestamp, tolerance, now):
        return False
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest("sha256=" + mac.hexdigest(), fields.get("x-console-signature", ""))
