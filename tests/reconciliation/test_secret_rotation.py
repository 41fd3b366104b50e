"""Rotating the secret key as Django documents it (the new key in SECRET_KEY, the old one
moved into SECRET_KEY_FALLBACKS) keeps every stored secret readable; ``reencrypt_secrets``
then moves them onto the new key, after which the old one can go."""

from __future__ import annotations

import json
import secrets
from io import StringIO
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from approvals.callbacks.registry import secret_decrypt
from approvals.models import RuntimeCallback, Tenant
from reconciliation.adapters import MESSAGES, PAYMENTS, adapter_for, credential_for
from reconciliation.credentials import STORED_SECRETS, decrypt
from reconciliation.models import EscalationPolicy
from tests.conftest import PASSWORD, Runtime

pytestmark = pytest.mark.django_db

OLD_KEY = "old-" + secrets.token_urlsafe(50)
NEW_KEY = "new-" + secrets.token_urlsafe(50)


@pytest.fixture
def stored(settings: Any, tenant: Tenant, runtime: Runtime) -> dict[str, str]:
    """One secret of every kind the console stores, saved the way people save them (the
    admin's forms, the callback API) under OLD_KEY; what each one is."""
    settings.SECRET_KEY = OLD_KEY
    settings.SECRET_KEY_FALLBACKS = []
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)
    staff = Client()
    assert staff.login(username="root", password=PASSWORD)
    saved = {
        "payments": "sk_live_" + secrets.token_urlsafe(16),
        "messages": "whsec_" + secrets.token_urlsafe(16),
        "escalation": "whsec_" + secrets.token_urlsafe(16),
    }
    forms: list[tuple[str, dict[str, Any]]] = [
        ("adaptercredential", {"adapter": "payments", "secret": saved["payments"]}),
        ("webhooktarget", {"url": "https://hooks.example.com/m", "secret": saved["messages"]}),
        ("escalationpolicy", {"after_minutes": 30, "secret": saved["escalation"]}),
    ]
    for path, form in forms:
        response = staff.post(f"/admin/reconciliation/{path}/add/", {"tenant": tenant.pk, **form})
        assert response.status_code == 302, response.content
    registered = runtime.client.put(
        "/api/v1/callback",
        json.dumps({"url": "https://agents.example.com/hook"}),
        content_type="application/json",
    )
    assert registered.status_code == 200, registered.content
    saved["callback"] = registered.json()["secret"]
    return saved


def read_back(tenant: Tenant) -> dict[str, str]:
    """Every stored secret as the code that uses it reads it."""
    messages = adapter_for(MESSAGES, tenant_id=tenant.pk)
    policy = EscalationPolicy.objects.get(tenant=tenant)
    return {
        "payments": credential_for(tenant_id=tenant.pk, adapter=PAYMENTS),
        "messages": getattr(messages, "secret", ""),
        "escalation": decrypt(policy.secret_encrypted),
        "callback": secret_decrypt(RuntimeCallback.objects.get().secret_encrypted),
    }


def test_every_encrypted_field_is_known() -> None:
    """A secret stored elsewhere would be missed by the rotation below and by
    ``reencrypt_secrets``: every ``*_encrypted`` field of every model is in the table."""
    encrypted = {
        (model._meta.label, field.name)
        for model in apps.get_models()
        for field in model._meta.get_fields()
        if field.name.endswith("_encrypted")
    }

    assert encrypted == {(model._meta.label, field) for model, field, _ in STORED_SECRETS}


def test_a_rotated_secret_key_still_reads_every_stored_secret(
    settings: Any, tenant: Tenant, stored: dict[str, str]
) -> None:
    assert read_back(tenant) == stored

    settings.SECRET_KEY = NEW_KEY
    settings.SECRET_KEY_FALLBACKS = [OLD_KEY]

    assert read_back(tenant) == stored


def test_without_the_old_key_nothing_reads(
    settings: Any, tenant: Tenant, stored: dict[str, str]
) -> None:
    settings.SECRET_KEY = NEW_KEY
    settings.SECRET_KEY_FALLBACKS = []

    assert read_back(tenant) == {"payments": "", "messages": "", "escalation": "", "callback": ""}


def test_reencrypting_moves_every_secret_onto_the_new_key(
    settings: Any, tenant: Tenant, stored: dict[str, str]
) -> None:
    settings.SECRET_KEY = NEW_KEY
    settings.SECRET_KEY_FALLBACKS = [OLD_KEY]
    out = StringIO()

    call_command("reencrypt_secrets", stdout=out)

    assert "reconciliation.AdapterCredential: 1 re-encrypted" in out.getvalue()
    assert "approvals.RuntimeCallback: 1 re-encrypted" in out.getvalue()
    settings.SECRET_KEY_FALLBACKS = []
    assert read_back(tenant) == stored


def test_reencrypting_reports_a_secret_no_key_reads(
    settings: Any, tenant: Tenant, stored: dict[str, str]
) -> None:
    settings.SECRET_KEY = NEW_KEY
    settings.SECRET_KEY_FALLBACKS = []
    err = StringIO()

    with pytest.raises(CommandError) as failed:
        call_command("reencrypt_secrets", stdout=StringIO(), stderr=err)

    assert failed.value.returncode == 1
    assert "approvals.RuntimeCallback: 1 unreadable" in err.getvalue()
