"""Adapter secrets at rest (payments API keys, the messages and escalation webhooks'
signing secrets): encrypted by ``approvals.access.encryption``, readable after a secret-key
rotation through ``SECRET_KEY_FALLBACKS``, never shown after saving, never logged or
exported. A secret that no key reads any more reads as missing, which an adapter call
reports as refused."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models

from approvals.access.encryption import Purpose, secret_decrypt, secret_encrypt, secret_reencrypt
from approvals.models import ReviewerGroup, RuntimeCallback
from reconciliation.models import AdapterCredential, EscalationPolicy, WebhookTarget

# Every stored secret: its model, its field and what it was encrypted for. A new encrypted
# field belongs here (tests/reconciliation/test_secret_rotation.py fails until it is).
STORED_SECRETS: tuple[tuple[type[models.Model], str, Purpose], ...] = (
    (RuntimeCallback, "secret_encrypted", Purpose.CALLBACK_SECRETS),
    (AdapterCredential, "secret_encrypted", Purpose.ADAPTER_CREDENTIALS),
    (WebhookTarget, "secret_encrypted", Purpose.ADAPTER_CREDENTIALS),
    (EscalationPolicy, "secret_encrypted", Purpose.ADAPTER_CREDENTIALS),
    # A reviewer group's Slack webhook URL and generic webhook secret (approvals.routing).
    (ReviewerGroup, "slack_webhook_encrypted", Purpose.NOTIFICATION_SECRETS),
    (ReviewerGroup, "webhook_secret_encrypted", Purpose.NOTIFICATION_SECRETS),
    # Its Slack app's bot token (approvals.notifications.slack_app).
    (ReviewerGroup, "slack_bot_token_encrypted", Purpose.NOTIFICATION_SECRETS),
)


def encrypt(secret: str) -> str:
    return secret_encrypt(secret, purpose=Purpose.ADAPTER_CREDENTIALS)


def decrypt(stored: str) -> str:
    return secret_decrypt(stored, purpose=Purpose.ADAPTER_CREDENTIALS)


@dataclass
class Reencrypted:
    """What ``stored_secrets_reencrypt`` did: per ``app_label.Model``, how many secrets it
    moved onto the current key, and how many no key reads (left as they are)."""

    moved: dict[str, int]
    unreadable: dict[str, int]


def stored_secrets_reencrypt() -> Reencrypted:
    """Encrypt every stored secret again with the current ``SECRET_KEY``, so that the keys
    in ``SECRET_KEY_FALLBACKS`` are no longer needed to read them. Each row is rewritten
    only if it still holds the value read, so a secret saved meanwhile is not overwritten."""
    result = Reencrypted(moved={}, unreadable={})
    for model, field, purpose in STORED_SECRETS:
        label = model._meta.label
        moved = unreadable = 0
        rows = model._default_manager.exclude(**{field: ""}).values_list("pk", field)
        for pk, stored in rows.iterator():
            fresh = secret_reencrypt(stored, purpose=purpose)
            if fresh is None:
                unreadable += 1
                continue
            moved += model._default_manager.filter(pk=pk, **{field: stored}).update(
                **{field: fresh}
            )
        result.moved[label] = moved
        result.unreadable[label] = unreadable
    return result
