"""Issue 26's routing page (``/manage/routing/``): a new webhook's signing secret crosses a
redirect (post/redirect/get) and is shown once, never in a URL or a log; choosing a group
fills the group form with its name, members and webhook (an htmx partial), for the
tenant's admins only; a rule's Change fills the rule form."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from django.test import Client

from approvals.models import Membership, ReviewerGroup, RoutingRuleVersion, Tenant
from approvals.routing.changes import (
    group_secret_decrypt,
    reviewer_group_save,
    routing_rule_remove,
    routing_rule_save,
)
from approvals.web.routing import SECRET_HANDOFF
from tests.approvals.test_views_html import signed_in
from tests.conftest import make_user

pytestmark = pytest.mark.django_db

HOOK = "http://127.0.0.1:9/hook"
SECRET = re.compile(rb"whsec_[A-Za-z0-9+/=_-]+")


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    settings.CALLBACK_ALLOW_HTTP = settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True


def save_group(admin: Client, tenant: Tenant, **fields: Any) -> Any:
    return admin.post("/manage/routing/groups", {"tenant": tenant.slug, **fields})


# --- the secret: post/redirect/get, shown once ---------------------------------------------


def test_a_new_webhooks_secret_is_shown_once_after_the_redirect(
    tenant: Tenant, admin_user: Any, second_reviewer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    admin = signed_in(admin_user)
    caplog.set_level(logging.DEBUG)

    posted = save_group(
        admin, tenant, name="finance-leads", members=[second_reviewer.pk], webhook_url=HOOK
    )

    # A redirect, so a reload of the page that shows the secret posts nothing again.
    assert posted.status_code in (302, 303), posted.content
    assert posted["Location"] == f"/manage/routing/?tenant={tenant.slug}"
    assert not SECRET.search(posted.content)
    secret = group_secret_decrypt(ReviewerGroup.objects.get().webhook_secret_encrypted)
    assert secret.startswith("whsec_")
    # Between the two answers the session holds it encrypted, never in the clear.
    kept = admin.session[SECRET_HANDOFF]
    assert secret not in repr(dict(admin.session.items())) and kept["sealed"]

    page = admin.get(posted["Location"])
    assert page.status_code == 200
    assert SECRET.findall(page.content) == [secret.encode()]
    assert b"The webhook signing secret of <strong>finance-leads</strong>" in page.content
    assert b"Saved group finance-leads." in page.content
    assert "no-store" in page["Cache-Control"]
    assert SECRET_HANDOFF not in admin.session

    again = admin.get(posted["Location"])
    assert again.status_code == 200 and not SECRET.search(again.content)
    assert b'id="webhook-secret"' not in again.content
    # Nothing the console logged on the way carries it.
    assert secret not in caplog.text
    assert all(secret not in str(record.__dict__) for record in caplog.records)


def test_a_rotated_secret_is_shown_once_too_and_a_plain_save_shows_none(
    tenant: Tenant, admin_user: Any, second_reviewer: Any
) -> None:
    admin = signed_in(admin_user)
    group = reviewer_group_save(
        tenant=tenant, admin=admin_user, name="leads", member_ids=[], webhook_url=HOOK
    ).group
    before = group_secret_decrypt(group.webhook_secret_encrypted)

    plain = save_group(admin, tenant, group=group.pk, name="leads", webhook_url=HOOK)
    assert plain.status_code == 302
    assert not SECRET.search(admin.get(plain["Location"]).content)

    rotated = save_group(
        admin, tenant, group=group.pk, name="leads", webhook_url=HOOK, rotate_secret="on"
    )
    assert rotated.status_code == 302
    group.refresh_from_db()
    after = group_secret_decrypt(group.webhook_secret_encrypted)
    assert after != before
    assert SECRET.findall(admin.get(rotated["Location"]).content) == [after.encode()]
    assert not SECRET.search(admin.get(rotated["Location"]).content)


def test_the_secret_waits_for_its_own_tenants_page(
    tenant: Tenant, other_tenant: Tenant, admin_user: Any
) -> None:
    Membership.objects.create(user=admin_user, tenant=other_tenant, role=Membership.Role.ADMIN)
    admin = signed_in(admin_user)

    posted = save_group(admin, tenant, name="leads", webhook_url=HOOK)

    assert not SECRET.search(admin.get(f"/manage/routing/?tenant={other_tenant.slug}").content)
    assert len(SECRET.findall(admin.get(posted["Location"]).content)) == 1


def test_a_refused_save_keeps_what_was_typed_and_mints_no_secret(
    tenant: Tenant, admin_user: Any, reviewer: Any
) -> None:
    admin = signed_in(admin_user)
    reviewer_group_save(tenant=tenant, admin=admin_user, name="leads", member_ids=[])

    refused = save_group(admin, tenant, name="leads", members=[reviewer.pk], webhook_url=HOOK)

    assert refused.status_code == 422
    body = refused.content.decode()
    assert "There is already a group named" in body
    assert 'value="leads"' in body and 'value="http://127.0.0.1:9/hook"' in body
    assert f'value="{reviewer.pk}" checked' in body
    assert not SECRET.search(refused.content) and SECRET_HANDOFF not in admin.session


# --- choosing a group fills the form -------------------------------------------------------


@pytest.fixture
def leads(tenant: Tenant, admin_user: Any, second_reviewer: Any) -> ReviewerGroup:
    return reviewer_group_save(
        tenant=tenant,
        admin=admin_user,
        name="finance-leads",
        member_ids=[second_reviewer.pk],
        slack_webhook_url="https://hooks.slack.example/services/T0/B0/slack-secret",
        webhook_url=HOOK,
    ).group


def test_choosing_a_group_fills_the_form_with_its_members(
    tenant: Tenant, admin_user: Any, reviewer: Any, second_reviewer: Any, leads: ReviewerGroup
) -> None:
    admin = signed_in(admin_user)

    fragment = admin.get(
        f"/manage/routing/?tenant={tenant.slug}&group={leads.pk}",
        headers={"HX-Request": "true", "HX-Target": "group-fields"},
    )

    assert fragment.status_code == 200
    body = fragment.content.decode()
    assert body.lstrip().startswith('<div id="group-fields">') and "<html" not in body
    assert re.search(r'id="group-name"[^>]* value="finance-leads"', body)
    assert f'value="{second_reviewer.pk}" checked' in body
    assert f'value="{reviewer.pk}">' in body  # not a member: not ticked
    assert f'value="{HOOK}"' in body
    # The Slack URL is a secret: the form says there is one and never shows it.
    assert "This group has one" in body and "slack-secret" not in body
    assert "Remove the Slack webhook" in body and "Rotate its signing secret" in body

    # A new group: an empty form.
    empty = admin.get(
        f"/manage/routing/?tenant={tenant.slug}&group=",
        headers={"HX-Request": "true", "HX-Target": "group-fields"},
    ).content.decode()
    assert 'value=""' in empty and " checked" not in empty and "Remove the" not in empty

    # Without JavaScript: the group's Change link opens the page with the form filled in.
    page = admin.get("/manage/routing/").content.decode()
    link = f"/manage/routing/?tenant={tenant.slug}&amp;group={leads.pk}#group-form-h"
    assert link in page
    whole = admin.get(f"/manage/routing/?tenant={tenant.slug}&group={leads.pk}").content.decode()
    assert f'<option value="{leads.pk}" selected>finance-leads</option>' in whole
    assert f'value="{second_reviewer.pk}" checked' in whole


def test_another_tenants_group_cannot_be_read(
    tenant: Tenant, other_tenant: Tenant, admin_user: Any
) -> None:
    theirs_admin = make_user("gina", other_tenant, Membership.Role.ADMIN)
    theirs = reviewer_group_save(
        tenant=other_tenant,
        admin=theirs_admin,
        name="globex-secret-council",
        member_ids=[theirs_admin.pk],
        webhook_url="http://127.0.0.1:9/globex-hook",
    ).group
    admin = signed_in(admin_user)
    htmx = {"HX-Request": "true", "HX-Target": "group-fields"}

    for url in (
        f"/manage/routing/?tenant={tenant.slug}&group={theirs.pk}",
        f"/manage/routing/?tenant={other_tenant.slug}&group={theirs.pk}",
        f"/manage/routing/?group={theirs.pk}",
    ):
        for headers in ({}, htmx):
            answer = admin.get(url, headers=headers)
            assert answer.status_code == 404, (url, headers)
            assert b"globex" not in answer.content.lower(), (url, headers)
    assert admin.get(f"/manage/routing/?group=x{theirs.pk}").status_code == 404
    # Nor changed by naming it in a post.
    posted = save_group(admin, tenant, group=theirs.pk, name="mine now")
    assert posted.status_code == 404
    theirs.refresh_from_db()
    assert theirs.name == "globex-secret-council"


def test_only_admins_read_a_group(tenant: Tenant, reviewer: Any, leads: ReviewerGroup) -> None:
    answer = signed_in(reviewer).get(
        f"/manage/routing/?tenant={tenant.slug}&group={leads.pk}",
        headers={"HX-Request": "true", "HX-Target": "group-fields"},
    )
    assert answer.status_code == 403 and b"finance-leads" not in answer.content
    anonymous = Client().get(f"/manage/routing/?group={leads.pk}")
    assert anonymous.status_code == 302 and "/login" in anonymous["Location"]


def test_removing_a_webhook_from_the_filled_form_removes_it(
    tenant: Tenant, admin_user: Any, second_reviewer: Any, leads: ReviewerGroup
) -> None:
    admin = signed_in(admin_user)
    # As the filled form posts it: the URL still in its field, "Remove the webhook" ticked.
    answer = save_group(
        admin,
        tenant,
        group=leads.pk,
        name="finance-leads",
        members=[second_reviewer.pk],
        webhook_url=HOOK,
        remove_webhook="on",
    )
    assert answer.status_code == 302
    leads.refresh_from_db()
    assert (leads.webhook_url, leads.webhook_secret_encrypted) == ("", "")
    assert leads.slack_webhook_encrypted  # untouched


# --- a rule's Change fills the rule form ---------------------------------------------------


def test_a_rules_change_link_fills_the_rule_form_with_its_current_version(
    tenant: Tenant, other_tenant: Tenant, admin_user: Any, leads: ReviewerGroup
) -> None:
    support = reviewer_group_save(
        tenant=tenant, admin=admin_user, name="support", member_ids=[]
    ).group
    version = routing_rule_save(
        tenant=tenant,
        admin=admin_user,
        tool="issue_refund",
        name="large refunds",
        group_ids=[leads.pk],
        fallback_group_id=support.pk,
        currency="EUR",
        amount_over_minor=50000,
        amount_up_to_minor=1000000,
    )
    admin = signed_in(admin_user)
    listed = admin.get("/manage/routing/").content.decode()
    assert f"?tenant={tenant.slug}&amp;rule={version.rule_id}#rule-form-h" in listed

    html = admin.get(f"/manage/routing/?rule={version.rule_id}").content.decode()

    form = html[html.index('id="rule-form"') :]
    assert '<option value="issue_refund" selected>' in form
    assert re.search(r'id="rule-name"[^>]* value="large refunds"', form)
    assert f'name="groups" value="{leads.pk}" checked' in form
    assert f'name="groups" value="{support.pk}">' in form
    assert f'<option value="{support.pk}" selected>support</option>' in form
    assert re.search(r'id="rule-currency"[^>]* value="EUR"', form)
    assert re.search(r'id="rule-over"[^>]* value="500.00"', form)
    assert re.search(r'id="rule-up-to"[^>]* value="10,000.00"', form)

    # Saved as filled, it is the same rule's next version, with the same band.
    posted = admin.post(
        "/manage/routing/rules",
        {
            "tenant": tenant.slug,
            "tool": "issue_refund",
            "name": "large refunds",
            "groups": [leads.pk],
            "fallback_group": support.pk,
            "currency": "EUR",
            "amount_over": "500.00",
            "amount_up_to": "10,000.00",
        },
    )
    assert posted.status_code == 302
    current = RoutingRuleVersion.objects.get(rule_id=version.rule_id, is_current=True)
    assert (current.version, current.amount_over_minor, current.amount_up_to_minor) == (
        2,
        50000,
        1000000,
    )

    # Another tenant's rule, or a removed one, is not read.
    theirs_admin = make_user("gina", other_tenant, Membership.Role.ADMIN)
    theirs_group = reviewer_group_save(
        tenant=other_tenant, admin=theirs_admin, name="globex-group", member_ids=[]
    ).group
    theirs = routing_rule_save(
        tenant=other_tenant,
        admin=theirs_admin,
        tool="issue_refund",
        name="globex-rule",
        group_ids=[theirs_group.pk],
    )
    for url in (f"/manage/routing/?rule={theirs.rule_id}", "/manage/routing/?rule=x"):
        answer = admin.get(url)
        assert answer.status_code == 404 and b"globex" not in answer.content
    routing_rule_remove(tenant=tenant, admin=admin_user, rule_id=version.rule_id)
    assert admin.get(f"/manage/routing/?rule={version.rule_id}").status_code == 404


def test_a_refused_rule_keeps_what_was_typed(
    tenant: Tenant, admin_user: Any, leads: ReviewerGroup
) -> None:
    refused = signed_in(admin_user).post(
        "/manage/routing/rules",
        {
            "tenant": tenant.slug,
            "tool": "issue_refund",
            "name": "odd band",
            "groups": [leads.pk],
            "currency": "EUR",
            "amount_over": "5.001",
        },
    )
    assert refused.status_code == 422
    form = refused.content.decode()
    form = form[form.index('id="rule-form"') :]
    # Said at the top, where the page opens, with the way to the form; and at the form.
    assert (
        '<p class="notice notice--error" role="alert">The rule was not saved: 5.001 has too '
        'many decimals. <a href="#rule-form-h">To the rule form</a>' in refused.content.decode()
    )
    at_form = refused.content.decode().split('id="rule-form-h"', 1)[1]
    assert at_form.index("5.001 has too many decimals.") < at_form.index('id="rule-form"')
    assert re.search(r'id="rule-name"[^>]* value="odd band"', form)
    assert re.search(r'id="rule-over"[^>]* value="5.001"', form)
    assert f'name="groups" value="{leads.pk}" checked' in form
