"""The Access tokens page: a reviewer creates (shown once), lists and revokes tokens."""

from __future__ import annotations

import json
import re
from typing import Any

from django.test import Client

from approvals.access import reviewer_tokens
from approvals.models import AuditEvent, Membership, ReviewerToken, Tenant
from tests.conftest import Runtime, make_user


def signed_in(user: Any, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def created_token(html: str) -> str:
    found = re.search(r'<code id="new-token" class="digest-value">(pat_[^<]+)</code>', html)
    assert found, html
    return found.group(1)


def test_a_reviewer_creates_a_token_shown_once_and_it_decides(
    reviewer: Any, runtime: Runtime
) -> None:
    client = signed_in(reviewer)

    response = client.post("/account/tokens/create", {"name": "ci", "lifetime_days": "7"})

    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    raw = created_token(response.content.decode())
    token = ReviewerToken.objects.get()
    assert (token.name, token.user_id) == ("ci", reviewer.pk)
    # The list shows the prefix, never the token again.
    listing = client.get("/account/tokens/").content.decode()
    assert token.prefix in listing and raw not in listing
    occurrence_id = runtime.propose().json()["occurrence_id"]
    decided = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        f"/api/v1/occurrences/{occurrence_id}/decisions",
        json.dumps({"decision": "reject", "reason": "test run"}),
        content_type="application/json",
    )
    assert decided.status_code == 200


def test_the_header_links_the_page_for_reviewers_and_admins(
    reviewer: Any, admin_user: Any, tenant: Tenant
) -> None:
    # Admins find their members' tokens there.
    both = make_user("rev-admin", tenant, Membership.Role.REVIEWER, Membership.Role.ADMIN)
    for user in (reviewer, admin_user, both):
        assert 'href="/account/tokens/"' in signed_in(user).get("/reviews/").content.decode()


def test_a_bad_form_is_422_and_creates_nothing(reviewer: Any) -> None:
    client = signed_in(reviewer)

    for data in ({"name": "", "lifetime_days": "7"}, {"name": "ci", "lifetime_days": "365"}):
        response = client.post("/account/tokens/create", data)
        assert response.status_code == 422, data
        assert 'class="field-error"' in response.content.decode()
    assert not ReviewerToken.objects.exists()


def test_a_taken_name_is_said_so(reviewer: Any, tenant: Tenant) -> None:
    reviewer_tokens.reviewer_token_issue(user=reviewer, tenant=tenant, name="ci", lifetime_days=7)

    response = signed_in(reviewer).post(
        "/account/tokens/create", {"name": "ci", "lifetime_days": "7"}
    )

    assert response.status_code == 422
    assert "already have a token named" in response.content.decode()


def test_who_is_neither_reviewer_nor_admin_gets_403(operator: Any) -> None:
    assert signed_in(operator).get("/account/tokens/").status_code == 403
    created = signed_in(operator).post(
        "/account/tokens/create", {"name": "x", "lifetime_days": "7"}
    )
    assert created.status_code == 403
    assert not ReviewerToken.objects.exists()


def test_an_admin_who_does_not_review_sees_the_page_but_creates_no_token(admin_user: Any) -> None:
    page = signed_in(admin_user).get("/account/tokens/")
    assert page.status_code == 200
    assert 'id="token-create-form"' not in page.content.decode()
    created = signed_in(admin_user).post(
        "/account/tokens/create", {"name": "x", "lifetime_days": "7"}
    )
    assert created.status_code == 403
    assert not ReviewerToken.objects.exists()


def test_signed_out_goes_to_sign_in() -> None:
    response = Client().get("/account/tokens/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_a_reviewer_cannot_create_in_a_tenant_where_they_do_not_review(
    reviewer: Any, other_tenant: Tenant
) -> None:
    Membership.objects.create(user=reviewer, tenant=other_tenant, role=Membership.Role.OPERATOR)

    response = signed_in(reviewer).post(
        "/account/tokens/create", {"tenant": other_tenant.slug, "name": "x", "lifetime_days": "7"}
    )

    assert response.status_code == 422
    assert not ReviewerToken.objects.exists()


def test_revoke_own_token_and_not_anothers(
    reviewer: Any, second_reviewer: Any, tenant: Tenant
) -> None:
    mine, _ = reviewer_tokens.reviewer_token_issue(
        user=reviewer, tenant=tenant, name="ci", lifetime_days=7
    )
    theirs, _ = reviewer_tokens.reviewer_token_issue(
        user=second_reviewer, tenant=tenant, name="ci", lifetime_days=7
    )
    client = signed_in(reviewer)

    assert client.post(f"/account/tokens/{theirs.pk}/revoke").status_code == 404
    revoked = client.post(f"/account/tokens/{mine.pk}/revoke", follow=True)

    assert "Revoked access token ci" in revoked.content.decode()
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.revoked_at is not None and theirs.revoked_at is None
    assert "revoked" in client.get("/account/tokens/").content.decode()


def test_state_changes_need_csrf(reviewer: Any, tenant: Tenant) -> None:
    mine, _ = reviewer_tokens.reviewer_token_issue(
        user=reviewer, tenant=tenant, name="ci", lifetime_days=7
    )
    client = signed_in(reviewer, enforce_csrf_checks=True)

    assert (
        client.post("/account/tokens/create", {"name": "x", "lifetime_days": "7"}).status_code
        == 403
    )
    assert client.post(f"/account/tokens/{mine.pk}/revoke").status_code == 403
    mine.refresh_from_db()
    assert mine.revoked_at is None and ReviewerToken.objects.count() == 1


def test_the_page_reads_in_a_constant_number_of_queries(
    reviewer: Any, tenant: Tenant, django_assert_max_num_queries: Any
) -> None:
    for n in range(12):
        reviewer_tokens.reviewer_token_issue(
            user=reviewer, tenant=tenant, name=f"t{n}", lifetime_days=7
        )
    client = signed_in(reviewer)
    client.get("/account/tokens/")  # warm the session

    with django_assert_max_num_queries(6):
        response = client.get("/account/tokens/")

    assert response.status_code == 200
    assert response.content.decode().count('data-token-id="') == 12


def test_a_second_user_in_the_same_tenant_is_separate(tenant: Tenant) -> None:
    rita = make_user("r1", tenant, Membership.Role.REVIEWER)
    ravi = make_user("r2", tenant, Membership.Role.REVIEWER)
    reviewer_tokens.reviewer_token_issue(user=rita, tenant=tenant, name="mine", lifetime_days=7)

    assert 'data-token-id="' not in signed_in(ravi).get("/account/tokens/").content.decode()


def test_the_operations_pages_link_it_and_the_admin_pages_for_who_may_use_them(
    tenant: Tenant, approved: str
) -> None:
    """An operator who also reviews (or administers) finds Access tokens (and Admin) in the
    header of the operations console and the investigations page, as on the inbox."""
    both = make_user("both", tenant, Membership.Role.OPERATOR, Membership.Role.REVIEWER)
    ops_only = make_user("ops-only", tenant, Membership.Role.OPERATOR)
    ops_admin = make_user("ops-admin", tenant, Membership.Role.OPERATOR, Membership.Role.ADMIN)
    pages = ["/operations/", f"/operations/occurrences/{approved}/", "/investigations/"]
    for page in pages:
        html = signed_in(both).get(page)
        assert html.status_code == 200, page
        assert 'href="/account/tokens/"' in html.content.decode(), page
        assert 'href="/account/tokens/"' not in signed_in(ops_only).get(page).content.decode()
        admin_html = signed_in(ops_admin).get(page).content.decode()
        assert 'href="/account/tokens/"' in admin_html, page  # their members' tokens
        assert 'href="/manage/revocations/"' in admin_html, page


# --- a tenant admin and the members' tokens (issue 23) ------------------------------------


def test_an_admin_lists_the_members_tokens_of_the_tenants_they_administer(
    reviewer: Any, second_reviewer: Any, admin_user: Any, tenant: Tenant, other_tenant: Tenant
) -> None:
    _, raw = reviewer_tokens.reviewer_token_issue(
        user=reviewer, tenant=tenant, name="ci", lifetime_days=7
    )
    left, _ = reviewer_tokens.reviewer_token_issue(
        user=second_reviewer, tenant=tenant, name="laptop", lifetime_days=7
    )
    Membership.objects.filter(user=second_reviewer).delete()  # ravi left the tenant
    stranger = make_user("stranger", other_tenant, Membership.Role.REVIEWER)
    elsewhere, _ = reviewer_tokens.reviewer_token_issue(
        user=stranger, tenant=other_tenant, name="other", lifetime_days=7
    )

    html = signed_in(admin_user).get("/account/tokens/").content.decode()

    assert html.count('data-member-token-id="') == 2
    assert f'data-member-token-id="{elsewhere.pk}"' not in html
    assert "rita" in html and "ci" in html and "ravi" in html and "laptop" in html
    assert raw not in html
    row = html[html.index(f'data-member-token-id="{left.pk}"') :]
    assert "owner not a reviewer" in row[: row.index("</tr>")]


def test_an_admin_revokes_a_members_token_and_the_api_refuses_it_audited(
    reviewer: Any, admin_user: Any, tenant: Tenant, runtime: Runtime
) -> None:
    token, raw = reviewer_tokens.reviewer_token_issue(
        user=reviewer, tenant=tenant, name="ci", lifetime_days=7
    )

    page = signed_in(admin_user).post(f"/account/tokens/{token.pk}/revoke", follow=True)

    assert "Revoked access token ci" in page.content.decode()
    assert "of rita" in page.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is not None
    event = AuditEvent.objects.get(kind="reviewer_token.revoked")
    assert event.actor == "ada" and event.data["owner"] == "rita" and event.tenant == tenant
    occurrence_id = runtime.propose().json()["occurrence_id"]
    read = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get(f"/api/v1/occurrences/{occurrence_id}")
    assert read.status_code == 401


def test_an_admin_of_another_tenant_cannot_revoke(
    reviewer: Any, tenant: Tenant, other_tenant: Tenant
) -> None:
    token, _ = reviewer_tokens.reviewer_token_issue(
        user=reviewer, tenant=tenant, name="ci", lifetime_days=7
    )
    other_admin = make_user("oscar", other_tenant, Membership.Role.ADMIN)

    assert signed_in(other_admin).post(f"/account/tokens/{token.pk}/revoke").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None
    assert not AuditEvent.objects.filter(kind="reviewer_token.revoked").exists()


def test_the_admins_page_reads_in_a_constant_number_of_queries(
    admin_user: Any, tenant: Tenant, django_assert_max_num_queries: Any
) -> None:
    for n in range(12):
        member = make_user(f"member-{n}", tenant, Membership.Role.REVIEWER)
        reviewer_tokens.reviewer_token_issue(
            user=member, tenant=tenant, name="cli", lifetime_days=7
        )
    client = signed_in(admin_user)
    client.get("/account/tokens/")  # warm the session

    with django_assert_max_num_queries(7):
        response = client.get("/account/tokens/")

    assert response.content.decode().count('data-member-token-id="') == 12
