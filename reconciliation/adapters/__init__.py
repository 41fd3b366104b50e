"""Adapters by name, as tool contracts name them, configured for one tenant."""

from __future__ import annotations

from django.conf import settings

from reconciliation.adapters.base import Adapter
from reconciliation.adapters.payments import PaymentsAdapter
from reconciliation.adapters.webhook import WebhookAdapter
from reconciliation.credentials import decrypt
from reconciliation.models import AdapterCredential, WebhookTarget

PAYMENTS = "payments"
MESSAGES = "messages"
NAMES = (PAYMENTS, MESSAGES)


def can_query(name: str) -> bool:
    """Whether the adapter can tell a committed effect from none (without building it)."""
    return name == PAYMENTS


def can_compensate(name: str) -> bool:
    return name == PAYMENTS


def credential_for(*, tenant_id: int, adapter: str) -> str:
    """The tenant's secret for an adapter: the one an admin saved, else the environment's."""
    stored = (
        AdapterCredential.objects.filter(tenant_id=tenant_id, adapter=adapter)
        .values_list("secret_encrypted", flat=True)
        .first()
    )
    if stored is not None:
        return decrypt(stored)
    return str(settings.PAYMENTS_API_KEY) if adapter == PAYMENTS else ""


def adapter_for(name: str, *, tenant_id: int) -> Adapter | None:
    """The adapter a contract names, or None if the console has no such adapter."""
    if name == PAYMENTS:
        return PaymentsAdapter(
            base_url=settings.PAYMENTS_URL,
            api_key=credential_for(tenant_id=tenant_id, adapter=PAYMENTS),
        )
    if name == MESSAGES:
        target = WebhookTarget.objects.filter(tenant_id=tenant_id).first()
        if target is not None:
            return WebhookAdapter(url=target.url, secret=decrypt(target.secret_encrypted))
        return WebhookAdapter(
            url=settings.MESSAGES_WEBHOOK_URL, secret=settings.MESSAGES_WEBHOOK_SECRET
        )
    return None
