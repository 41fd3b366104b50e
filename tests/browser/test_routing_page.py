"""Issue 26's routing page in Chromium: choosing a group fills the group form by htmx (its
members ticked, its Slack URL never shown), and a new webhook's signing secret is shown
once after the redirect, gone on a reload."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.models import ReviewerGroup, Tenant
from approvals.routing.changes import group_secret_decrypt, reviewer_group_save
from tests.browser.a11y import axe_violations
from tests.browser.conftest import Contexts, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True


def test_choosing_a_group_fills_the_form_and_a_new_secret_shows_once(
    contexts: Contexts, tenant: Tenant, admin_user: Any, reviewer: Any, second_reviewer: Any
) -> None:
    reviewer_group_save(
        tenant=tenant,
        admin=admin_user,
        name="finance-leads",
        member_ids=[second_reviewer.pk],
        slack_webhook_url="https://hooks.slack.example/services/T0/B0/slack-secret",
    )
    page: Page = contexts.new(bypass_csp=True).new_page()  # for axe's injected script
    login(page, admin_user.username)
    page.goto("/manage/routing/")

    page.locator("#group-pick").select_option(label="finance-leads")
    expect(page.locator("#group-name")).to_have_value("finance-leads")
    expect(page.get_by_label("ravi", exact=True)).to_be_checked()
    expect(page.get_by_label("rita", exact=True)).not_to_be_checked()
    expect(page.locator("#group-fields")).to_contain_text("This group has one")
    assert "slack-secret" not in page.content()
    page.locator("#group-pick").select_option(label="A new group")
    expect(page.locator("#group-name")).to_have_value("")
    expect(page.get_by_label("ravi", exact=True)).not_to_be_checked()

    # Give finance-leads a webhook: the secret after the redirect, once.
    page.locator("#group-pick").select_option(label="finance-leads")
    expect(page.locator("#group-name")).to_have_value("finance-leads")
    page.locator("#group-webhook").fill("http://127.0.0.1:9/hook")
    with page.expect_navigation():
        page.get_by_role("button", name="Save group").click()
    secret = group_secret_decrypt(ReviewerGroup.objects.get().webhook_secret_encrypted)
    expect(page.locator("#webhook-secret code")).to_have_text(secret)
    assert "whsec_" not in page.url
    assert axe_violations(page) == []
    page.reload()
    expect(page.locator(".messages")).to_have_count(0)
    expect(page.locator("#webhook-secret")).to_have_count(0)
    expect(page.locator("tr[data-group='finance-leads']")).to_contain_text("ravi")


def test_an_admin_gives_a_group_a_slack_app_and_its_token_is_never_shown(
    contexts: Contexts, tenant: Tenant, admin_user: Any, second_reviewer: Any
) -> None:
    token = "xoxb-1111-2222-browserTOKEN0123"
    reviewer_group_save(
        tenant=tenant, admin=admin_user, name="finance-leads", member_ids=[second_reviewer.pk]
    )
    page: Page = contexts.new(bypass_csp=True).new_page()  # for axe's injected script
    login(page, admin_user.username)
    page.goto("/manage/routing/")
    page.locator("#group-pick").select_option(label="finance-leads")
    expect(page.locator("#group-name")).to_have_value("finance-leads")

    # A channel name instead of its id: the form's error, the token not echoed back.
    page.get_by_label("Bot token").fill(token)
    page.get_by_label("Channel id").fill("#finance")
    with page.expect_navigation():
        page.get_by_role("button", name="Save group").click()
    expect(page.locator(".field-error").first).to_contain_text("the Slack channel's id")
    expect(page.get_by_label("Bot token")).to_have_value("")
    assert token not in page.content()

    page.get_by_label("Bot token").fill(token)
    page.get_by_label("Channel id").fill("C0123ABCD")
    with page.expect_navigation():
        page.get_by_role("button", name="Save group").click()
    expect(page.locator("tr[data-group='finance-leads']")).to_contain_text("Slack app · C0123ABCD")
    group = ReviewerGroup.objects.get()
    assert group_secret_decrypt(group.slack_bot_token_encrypted) == token
    assert token not in page.content()
    assert axe_violations(page) == []

    # Chosen again: the channel fills the form, the token is only said to be set.
    page.locator("#group-pick").select_option(label="finance-leads")
    expect(page.get_by_label("Channel id")).to_have_value("C0123ABCD")
    expect(page.locator("#group-slack-app")).to_contain_text("This group has one")
    expect(page.get_by_label("Bot token")).to_have_value("")
    assert token not in page.content()
    page.get_by_label("Remove the Slack app").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Save group").click()
    expect(page.locator("tr[data-group='finance-leads']")).not_to_contain_text("Slack app")
    group.refresh_from_db()
    assert (group.slack_bot_token_encrypted, group.slack_channel_id) == ("", "")
