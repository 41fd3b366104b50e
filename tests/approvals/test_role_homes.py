"""Each role lands on its own home; the admin pages answer under /manage/, their old
addresses under /operations/ redirect (GET for good, a POST with its method kept); a 403
never tells an admin to ask an admin."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client

from approvals.models import Membership, RuntimeKey, Tenant
from tests.approvals.test_views_html import signed_in
from tests.conftest import PASSWORD, make_user


def sign_in(username: str) -> tuple[Client, Any]:
    client = Client()
    response = client.post("/accounts/login/", {"username": username, "password": PASSWORD})
    assert response.status_code == 302
    return client, response


@pytest.mark.parametrize(
    ("roles", "home"),
    [
        ((Membership.Role.REVIEWER,), "/reviews/"),
        ((Membership.Role.OPERATOR,), "/operations/"),
        ((Membership.Role.ADMIN,), "/manage/"),
        ((Membership.Role.ADMIN, Membership.Role.OPERATOR), "/operations/"),
        ((Membership.Role.ADMIN, Membership.Role.REVIEWER), "/reviews/"),
        ((), "/reviews/"),
    ],
)
def test_signing_in_lands_each_role_on_its_home(
    tenant: Tenant, roles: tuple[str, ...], home: str
) -> None:
    make_user("someone", tenant, *roles)
    client, response = sign_in("someone")
    assert response["Location"] == home
    assert client.get("/")["Location"] == home
    # The home answers: no 403, no empty inbox for somebody who reviews nothing.
    assert client.get(home, follow=True).status_code == 200


def test_the_admin_home_is_the_revocations_page(tenant: Tenant) -> None:
    make_user("ada", tenant, Membership.Role.ADMIN)
    client, response = sign_in("ada")
    landed = client.get(response["Location"], follow=True)
    assert landed.redirect_chain == [("/manage/revocations/", 302)]
    assert landed.status_code == 200


def test_a_next_page_still_wins_over_the_role_home(tenant: Tenant) -> None:
    make_user("otto", tenant, Membership.Role.OPERATOR)
    client = Client()
    response = client.post(
        "/accounts/login/?next=/investigations/", {"username": "otto", "password": PASSWORD}
    )
    assert response["Location"] == "/investigations/"


def test_a_403_never_tells_an_admin_to_ask_an_admin(tenant: Tenant) -> None:
    ada = make_user("ada", tenant, Membership.Role.ADMIN)
    rita = make_user("rita", tenant, Membership.Role.REVIEWER)

    admin_page = signed_in(ada).get("/operations/")  # an operator's page
    assert admin_page.status_code == 403
    text = admin_page.content.decode()
    assert "ask an admin" not in text.lower()
    assert 'href="/manage/"' in text and "Back to the admin pages" in text

    reviewer_page = signed_in(rita).get("/manage/keys/")
    assert reviewer_page.status_code == 403
    text = reviewer_page.content.decode()
    assert "ask an admin" in text.lower()
    assert 'href="/reviews/"' in text


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("/operations/keys/", "/manage/keys/"),
        ("/operations/revocations/", "/manage/revocations/"),
        ("/operations/revocations/?tool=issue_refund", "/manage/revocations/?tool=issue_refund"),
        ("/operations/credentials/", "/manage/credentials/"),
        (
            "/operations/revocations/batches/00000000-0000-0000-0000-000000000001/",
            "/manage/revocations/batches/00000000-0000-0000-0000-000000000001/",
        ),
    ],
)
def test_the_old_admin_addresses_redirect_for_good(tenant: Tenant, old: str, new: str) -> None:
    ada = make_user("ada", tenant, Membership.Role.ADMIN)
    response = signed_in(ada).get(old)
    assert response.status_code == 301
    assert response["Location"] == new


def test_a_form_posted_to_an_old_address_keeps_its_method(tenant: Tenant) -> None:
    ada = make_user("ada", tenant, Membership.Role.ADMIN)
    client = signed_in(ada)
    response = client.post("/operations/keys/create", {"name": "old-bookmark"})
    assert response.status_code == 307
    assert response["Location"] == "/manage/keys/create"
    followed = client.post("/operations/keys/create", {"name": "old-form"}, follow=True)
    assert followed.status_code == 200
    assert RuntimeKey.objects.filter(name="old-form", tenant=tenant).exists()
    # The operations console's own pages did not move.
    assert Client().get("/operations/").status_code == 302  # to sign in, not elsewhere
    assert (
        Client()
        .get(f"/operations/occurrences/{uuid.uuid4()}/")["Location"]
        .startswith("/accounts/login/")
    )
