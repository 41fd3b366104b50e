"""Adapter secrets in the Django admin: typed once, stored encrypted, never shown again;
replacing one records ``credentials.refreshed``."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from approvals.models import AuditEvent, Tenant
from reconciliation.adapters import credential_for
from reconciliation.models import AdapterCredential, WebhookTarget
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

SECRET = "sk_live_very-secret-value-123"


@pytest.fixture
def staff(tenant: Tenant) -> Client:
    get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)
    client = Client()
    assert client.login(username="root", password=PASSWORD)
    return client


def test_a_credential_is_stored_encrypted_and_never_shown(staff: Client, tenant: Tenant) -> None:
    response = staff.post(
        "/admin/reconciliation/adaptercredential/add/",
        {"tenant": tenant.pk, "adapter": "payments", "secret": SECRET},
    )
    assert response.status_code == 302, response.content

    stored = AdapterCredential.objects.get()
    assert SECRET not in stored.secret_encrypted
    assert credential_for(tenant_id=tenant.pk, adapter="payments") == SECRET
    change = staff.get(f"/admin/reconciliation/adaptercredential/{stored.pk}/change/")
    listing = staff.get("/admin/reconciliation/adaptercredential/")
    assert SECRET not in change.content.decode() and SECRET not in listing.content.decode()
    event = AuditEvent.objects.get(kind="credentials.refreshed")
    assert event.actor == "root" and event.data == {"adapter": "payments"}
    assert SECRET not in str(AuditEvent.objects.values_list("data", flat=True))


def test_replacing_a_credential_keeps_one_row(staff: Client, tenant: Tenant) -> None:
    staff.post(
        "/admin/reconciliation/adaptercredential/add/",
        {"tenant": tenant.pk, "adapter": "payments", "secret": "first-secret"},
    )
    row = AdapterCredential.objects.get()

    response = staff.post(
        f"/admin/reconciliation/adaptercredential/{row.pk}/change/", {"secret": "second-secret"}
    )

    assert response.status_code == 302, response.content
    assert AdapterCredential.objects.count() == 1
    assert credential_for(tenant_id=tenant.pk, adapter="payments") == "second-secret"
    assert AuditEvent.objects.filter(kind="credentials.refreshed").count() == 2


def test_a_webhook_secret_is_stored_encrypted(staff: Client, tenant: Tenant) -> None:
    response = staff.post(
        "/admin/reconciliation/webhooktarget/add/",
        {"tenant": tenant.pk, "url": "https://hooks.example.com/messages", "secret": SECRET},
    )
    assert response.status_code == 302, response.content
    target = WebhookTarget.objects.get()
    assert SECRET not in target.secret_encrypted
    page = staff.get(f"/admin/reconciliation/webhooktarget/{target.pk}/change/")
    assert SECRET not in page.content.decode()


def test_evidence_is_read_only_in_the_admin(staff: Client) -> None:
    for model in ("adapterinvocation", "interruption", "epochadmission"):
        assert staff.get(f"/admin/reconciliation/{model}/add/").status_code == 403


def test_settings_default_applies_without_a_stored_credential(
    tenant: Tenant, settings: Any
) -> None:
    settings.PAYMENTS_API_KEY = "sk_from_env"
    assert credential_for(tenant_id=tenant.pk, adapter="payments") == "sk_from_env"
