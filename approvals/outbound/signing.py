"""Standard Webhooks signatures (https://www.standardwebhooks.com/), made by the reference
implementation (the ``standardwebhooks`` package)::

    webhook-id: <message id>              (the same on every retry of one message)
    webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>

A receiver verifies with ``standardwebhooks.Webhook(secret).verify(body, headers)``, which
also refuses a timestamp more than five minutes away from its clock: a captured message
cannot be replayed later.

The key is the secret's bytes as Standard Webhooks spells a secret: ``whsec_`` and base64.
The console's callback secrets were minted as ``whsec_`` and URL-safe base64 (``-`` and
``_`` where standard base64 has ``+`` and ``/``), which ``Webhook`` would decode wrongly, so
either alphabet is read here; ``standard_secret`` spells a secret the way ``Webhook``
takes it. A secret that is not ``whsec_`` and base64 (one an operator typed) is used as
its UTF-8 bytes: ``Webhook(secret.encode())`` on the receiving side.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime

from standardwebhooks.webhooks import (
    EmptyWebhookSecretError,
    Webhook,
    WebhookVerificationError,
)

PREFIX = "whsec_"
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"


def signing_key(secret: str) -> bytes:
    """The HMAC key a secret stands for (see the module's docstring)."""
    if secret.startswith(PREFIX):
        encoded = secret.removeprefix(PREFIX).replace("-", "+").replace("_", "/")
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if key:
            return key
    return secret.encode()


def standard_secret(secret: str) -> str:
    """The secret as ``standardwebhooks.Webhook`` takes it: ``whsec_`` and standard base64
    of its key. The same string for a secret minted that way."""
    return PREFIX + base64.b64encode(signing_key(secret)).decode()


def signed_headers(*, secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers for one message. With no secret (a deployment that set
    none) the signature is left out, and a receiver that verifies refuses the message."""
    headers = {ID_HEADER: message_id, TIMESTAMP_HEADER: str(timestamp)}
    if secret:
        moment = datetime.fromtimestamp(timestamp, tz=UTC)
        headers[SIGNATURE_HEADER] = Webhook(signing_key(secret)).sign(message_id, moment, body)
    return headers


def verify(*, secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does, with the package: the signature matches and the timestamp is
    within its five minutes."""
    try:
        Webhook(signing_key(secret)).verify(body, headers, json_parse=False)
    except (WebhookVerificationError, EmptyWebhookSecretError):
        return False
    return True
