"""The webhook adapter: POSTs the command as JSON to the tenant's URL, signed.

Signed twice over the same body: Standard Webhooks' ``webhook-id`` (the command's
idempotency key), ``webhook-timestamp`` and ``webhook-signature``
(``approvals.outbound.signing``), which a receiver verifies with the ``standardwebhooks``
package, refusing a message older than five minutes; and the older ``X-Signature``, an
HMAC of the body alone, kept for receivers that check it, though a captured message
replays under it.

A receiver may not dedupe (the contract is ``unsafe``), and a generic receiver documents
nothing, so only an explicit 4xx counts as refused before execution; a 5xx, a timeout or a
reset connection may have delivered the message and is ``Unknown``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import httpx

from approvals.outbound import signing
from reconciliation.adapters.base import (
    Call,
    Committed,
    Interrupted,
    QueryResult,
    Rejected,
    Result,
    Unknown,
    challenges_of,
    http_client,
    transport_failure,
)

SIGNATURE_HEADER = "X-Signature"


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of the exact body bytes with the tenant's secret (no
    timestamp: the older header, kept beside the Standard Webhooks ones)."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def signed_headers(*, secret: str, message_id: str, body: bytes) -> dict[str, str]:
    """Both signatures of one message, timestamped now (the escalation webhook's too)."""
    return {
        SIGNATURE_HEADER: sign(secret, body),
        **signing.signed_headers(
            secret=secret, message_id=message_id, timestamp=int(time.time()), body=body
        ),
    }


class WebhookAdapter:
    name = "messages"
    can_query = False
    can_compensate = False

    def __init__(self, *, url: str, secret: str) -> None:
        self.url = url
        self.secret = secret

    def execute(self, call: Call) -> Result:
        body = json.dumps(
            {
                "command_id": call.command_id,
                "idempotency_key": call.idempotency_key,
                "tool": call.tool,
                "arguments": call.arguments,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": call.idempotency_key,
            **signed_headers(secret=self.secret, message_id=call.idempotency_key, body=body),
        }
        try:
            response = http_client().post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return transport_failure(exc)
        if response.is_success:
            try:
                receipt = str(response.json().get("id", ""))
            except (ValueError, AttributeError):
                receipt = ""
            return Committed(receipt=receipt, detail=str(response.status_code))
        if response.status_code == 401:
            return Interrupted(challenges_of(response), f"401 from {self.url}")
        if 400 <= response.status_code < 500:
            return Rejected(f"{response.status_code} {response.reason_phrase}")
        return Unknown(f"{response.status_code} {response.reason_phrase} from the receiver")

    def query_effect(self, call: Call) -> QueryResult:
        return Unknown("a webhook receiver cannot be asked whether it got a message")

    def compensate(self, call: Call, receipt: str) -> Result:
        return Rejected("a sent message cannot be recalled; record a manual compensation")
