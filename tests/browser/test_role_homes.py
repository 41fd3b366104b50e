"""Signing in, in Chromium: each role lands on its own home; an admin's old bookmark
under /operations/ opens the page at its new address; a 403 shows an admin the way home."""

from __future__ import annotations

import os
import re

import pytest
from playwright.sync_api import expect

from approvals.models import Membership, Tenant
from tests.browser.a11y import AxeReport
from tests.browser.conftest import Contexts, login
from tests.conftest import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = os.environ.get("CONSOLE_SHOTS_DIR", "")


def test_each_role_lands_on_its_home_and_old_admin_addresses_still_open(
    contexts: Contexts, tenant: Tenant
) -> None:
    make_user("rita", tenant, Membership.Role.REVIEWER)
    make_user("otto", tenant, Membership.Role.OPERATOR)
    make_user("ada", tenant, Membership.Role.ADMIN)
    axe = AxeReport()

    for username, path, heading in (
        ("rita", r"/reviews/$", "Inbox"),
        ("otto", r"/operations/$", None),
        ("ada", r"/manage/revocations/$", None),
    ):
        page = contexts.new(bypass_csp=True).new_page()
        login(page, username)
        expect(page).to_have_url(re.compile(path))
        if heading:
            expect(page.get_by_role("heading", level=1)).to_have_text(heading)
        expect(page.get_by_text("You are not a reviewer")).to_have_count(0)
        axe.check(page, f"home of {username}")
        if username != "ada":
            page.context.close()

    # The admin's bookmark of the old address, and the brand link back home.
    page.goto("/operations/keys/")
    expect(page).to_have_url(re.compile(r"/manage/keys/$"))
    expect(page.get_by_role("heading", level=1)).to_contain_text("Runtime keys")
    page.locator("a.brand").click()
    expect(page).to_have_url(re.compile(r"/manage/revocations/$"))

    # An operator's page: refused, without telling an admin to ask an admin.
    page.goto("/operations/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Not allowed")
    expect(page.get_by_text(re.compile("ask an admin", re.I))).to_have_count(0)
    axe.check(page, "403 for an admin")
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "403-admin.png"))
    page.get_by_role("link", name="Back to the admin pages").click()
    expect(page).to_have_url(re.compile(r"/manage/revocations/$"))
    axe.assert_clean()
