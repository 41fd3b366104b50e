"""An admin deactivates a runtime key in Chromium: a confirmation names it and its last use,
and the key list offers to reactivate it within the grace period."""

from __future__ import annotations

import os
import re

import pytest
from playwright.sync_api import expect

from approvals.models import Membership, RuntimeKey, Tenant
from tests.browser.a11y import AxeReport
from tests.browser.conftest import Contexts, login
from tests.conftest import Runtime, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = os.environ.get("CONSOLE_SHOTS_DIR", "")


def test_deactivate_asks_then_reactivate_undoes_it(
    contexts: Contexts, tenant: Tenant, runtime: Runtime
) -> None:
    make_user("ada", tenant, Membership.Role.ADMIN)
    runtime.propose()  # the key has a last use
    page = contexts.new(bypass_csp=True).new_page()
    axe = AxeReport()
    login(page, "ada")
    page.goto("/manage/keys/")
    row = page.locator(f'tr[data-key-id="{runtime.key.pk}"]')
    row.get_by_role("link", name=re.compile("Deactivate")).click()

    expect(page.get_by_role("heading", level=1)).to_have_text("Deactivate runtime key agent?")
    expect(page.locator("#key-last-used")).to_contain_text("just now")
    axe.check(page, "deactivation confirmation")
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "key-deactivate.png"))
    assert RuntimeKey.objects.get(pk=runtime.key.pk).is_active
    page.locator("#deactivate-confirm").click()

    expect(page).to_have_url(re.compile(r"/manage/keys/$"))
    expect(page.locator(".messages")).to_contain_text("Deactivated runtime key agent")
    expect(row).to_contain_text("deactivated")
    axe.check(page, "key list with a reactivable key")
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "keys-reactivable.png"))
    row.get_by_role("button", name=re.compile("Reactivate")).click()
    expect(page.locator(".messages")).to_contain_text("Reactivated runtime key agent")
    expect(row).to_contain_text("active")
    assert RuntimeKey.objects.get(pk=runtime.key.pk).is_active
    axe.assert_clean()
