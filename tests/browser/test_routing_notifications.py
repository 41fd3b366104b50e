"""Issue 26 in the browser: an admin routes refunds above EUR 500.00 to finance-leads (its
Slack channel a local receiver), a reviewer of that group configures her notifications,
and a request routed by its amount reaches the right group: her e-mail (a real SMTP
server), the group's Slack channel, her unread count and the top of her inbox; the other
group hears nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.models import NotificationPreference, Tenant
from tests.approvals import smtp_fixture
from tests.approvals.smtp_fixture import Mailbox, parts
from tests.approvals.test_callbacks import Receiver, receiver
from tests.approvals.test_notifications import drain, refund
from tests.browser.a11y import axe_violations
from tests.browser.conftest import Contexts, login
from tests.conftest import Runtime, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

smtp = smtp_fixture.smtp
__all__ = ["receiver"]


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True


def check(page: Page, label: str) -> None:
    page.get_by_label(label, exact=True).check()


def test_a_request_routed_by_amount_reaches_the_right_groups_channel(
    contexts: Contexts,
    tenant: Tenant,
    runtime: Runtime,
    admin_user: Any,
    reviewer: Any,
    smtp: Mailbox,
    receiver: Receiver,
) -> None:
    fiona = make_user("fiona", tenant, "reviewer")
    fiona.email = "fiona@acme.test"
    fiona.save(update_fields=["email"])
    reviewer.email = "rita@acme.test"
    reviewer.save(update_fields=["email"])

    # The admin: two groups, and a rule per band, on the routing page.
    admin: Page = contexts.new(bypass_csp=True).new_page()
    login(admin, admin_user.username)
    admin.goto("/manage/routing/")
    for name, member, slack in (("support", "rita", ""), ("finance-leads", "fiona", receiver.url)):
        admin.locator("#group-name").fill(name)
        check(admin, member)
        if slack:
            admin.locator("#group-slack").fill(slack)
        with admin.expect_navigation():
            admin.get_by_role("button", name="Save group").click()
        expect(admin.locator(f"tr[data-group='{name}']")).to_be_visible()
    for name, group, band in (
        ("refunds", "support", ""),
        ("large refunds", "finance-leads", "500.00"),
    ):
        admin.locator("#rule-tool").select_option("issue_refund")
        admin.locator("#rule-name").fill(name)
        check(admin, group)
        if band:
            admin.locator("#rule-currency").fill("EUR")
            admin.locator("#rule-over").fill(band)
        with admin.expect_navigation():
            admin.get_by_role("button", name="Save rule").click()
    expect(admin.locator("tr[data-rule='large refunds']")).to_contain_text("above EUR 500.00")
    assert axe_violations(admin) == []

    # The reviewer: every request by e-mail, in her time zone, no quiet hours.
    page: Page = contexts.new(bypass_csp=True).new_page()
    login(page, "fiona")
    page.goto("/account/notifications/")
    form = page.locator("#pref-email")
    form.get_by_label("Every request").check()
    form.locator("select[name=time_zone]").select_option("Europe/Berlin")
    with page.expect_navigation():
        form.get_by_role("button", name="Save").click()
    expect(page.locator(".notice--success")).to_contain_text("Saved")
    assert axe_violations(page) == []
    pref = NotificationPreference.objects.get(user=fiona, channel="email")
    assert (pref.mode, pref.time_zone) == ("every", "Europe/Berlin")

    small = runtime.propose(arguments=refund(2000), client_ref="small").json()["occurrence_id"]
    large = runtime.propose(arguments=refund(75000), client_ref="large").json()["occurrence_id"]
    assert sorted(drain()) == ["delivered", "delivered", "delivered"]

    # Fiona's mail names the large one; Rita's the small one; Slack heard the large one.
    (mail,) = smtp.to("fiona@acme.test")
    assert f"/reviews/{large}/" in parts(mail)[0] and "EUR 750.00" in parts(mail)[0]
    (rita_mail,) = smtp.to("rita@acme.test")
    assert f"/reviews/{small}/" in parts(rita_mail)[0]
    ((_, body),) = receiver.received
    assert "EUR 750.00" in json.loads(body)["text"] and large in json.loads(body)["text"]

    page.goto("/reviews/")
    expect(page.locator("#unread-count")).to_have_text("1")
    first = page.locator("tr[data-occurrence-id]").first
    expect(first).to_have_attribute("data-occurrence-id", large)
    expect(first.locator(".badge--routed")).to_have_text("Routed to you")
    first.get_by_role("link", name="Review").click()
    expect(page.locator("#routed-by")).to_contain_text("large refunds")
    expect(page.locator("#unread-count")).to_have_count(0)
    assert axe_violations(page) == []
