"""Deactivating a runtime key asks first, naming the key and its last use; within the grace
period (RUNTIME_KEY_REACTIVATION_HOURS) an admin can reactivate it; both are audited."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import AuditEvent, Membership, RuntimeKey, Tenant
from tests.approvals.test_views_html import parse, signed_in
from tests.conftest import Runtime, make_runtime, make_user


@pytest.fixture
def ada(tenant: Tenant) -> Any:
    return make_user("ada", tenant, Membership.Role.ADMIN)


def test_deactivating_asks_first_with_the_keys_name_and_last_use(
    ada: Any, runtime: Runtime
) -> None:
    runtime.propose()  # the key is used
    client = signed_in(ada)
    listing = client.get("/manage/keys/").content.decode()
    # The list links to a confirmation; it does not post the deactivation.
    assert f'href="/manage/keys/{runtime.key.pk}/deactivate"' in listing
    assert f'action="/manage/keys/{runtime.key.pk}/deactivate"' not in listing

    page = parse(client.get(f"/manage/keys/{runtime.key.pk}/deactivate"))
    assert page.text("key-name") == runtime.key.name
    assert "just now" in page.text("key-last-used")
    assert page.attr("deactivate-form", "action") == f"/manage/keys/{runtime.key.pk}/deactivate"
    assert "24 hours" in page.source
    assert RuntimeKey.objects.get(pk=runtime.key.pk).is_active  # asking changed nothing

    assert client.post(f"/manage/keys/{runtime.key.pk}/deactivate").status_code == 302
    key = RuntimeKey.objects.get(pk=runtime.key.pk)
    assert not key.is_active and key.deactivated_at is not None


def test_a_deactivated_key_is_reactivated_within_the_grace_period_and_both_are_audited(
    ada: Any, runtime: Runtime
) -> None:
    client = signed_in(ada)
    client.post(f"/manage/keys/{runtime.key.pk}/deactivate")
    assert runtime.propose().status_code == 401
    listing = client.get("/manage/keys/").content.decode()
    assert f'action="/manage/keys/{runtime.key.pk}/reactivate"' in listing

    response = client.post(f"/manage/keys/{runtime.key.pk}/reactivate", follow=True)
    assert "Reactivated runtime key agent" in response.content.decode()
    key = RuntimeKey.objects.get(pk=runtime.key.pk)
    assert key.is_active and key.deactivated_at is None
    assert runtime.propose().status_code == 201
    kinds = list(
        AuditEvent.objects.filter(kind__startswith="runtime_key.")
        .order_by("id")
        .values_list("kind", "actor", "decision")
    )
    assert kinds[-2:] == [
        ("runtime_key.deactivated", "ada", "deactivated"),
        ("runtime_key.reactivated", "ada", "reactivated"),
    ]
    # Once active, reactivating again changes and records nothing.
    client.post(f"/manage/keys/{runtime.key.pk}/reactivate")
    assert AuditEvent.objects.filter(kind="runtime_key.reactivated").count() == 1


def test_after_the_grace_period_a_key_stays_deactivated(
    ada: Any, runtime: Runtime, settings: Any
) -> None:
    settings.RUNTIME_KEY_REACTIVATION_HOURS = 1
    client = signed_in(ada)
    client.post(f"/manage/keys/{runtime.key.pk}/deactivate")
    RuntimeKey.objects.filter(pk=runtime.key.pk).update(
        deactivated_at=timezone.now() - timedelta(hours=1, minutes=1)
    )
    listing = client.get("/manage/keys/").content.decode()
    assert f'action="/manage/keys/{runtime.key.pk}/reactivate"' not in listing
    response = client.post(f"/manage/keys/{runtime.key.pk}/reactivate", follow=True)
    assert "cannot be reactivated" in response.content.decode()
    assert not RuntimeKey.objects.get(pk=runtime.key.pk).is_active
    assert not AuditEvent.objects.filter(kind="runtime_key.reactivated").exists()


def test_only_an_admin_of_the_keys_tenant_may_reactivate(
    ada: Any, runtime: Runtime, tenant: Tenant, other_tenant: Tenant
) -> None:
    signed_in(ada).post(f"/manage/keys/{runtime.key.pk}/deactivate")
    reviewer = make_user("rita", tenant, Membership.Role.REVIEWER)
    assert signed_in(reviewer).post(f"/manage/keys/{runtime.key.pk}/reactivate").status_code == 403
    stranger = make_user("olga", other_tenant, Membership.Role.ADMIN)
    assert signed_in(stranger).post(f"/manage/keys/{runtime.key.pk}/reactivate").status_code == 404
    assert signed_in(stranger).get(f"/manage/keys/{runtime.key.pk}/deactivate").status_code == 404
    assert not RuntimeKey.objects.get(pk=runtime.key.pk).is_active
    make_runtime(other_tenant, "theirs")
