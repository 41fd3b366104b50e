"""After approval the review page offers "Edit and withdraw this approval…", saying what
saving does; saving from it withdraws the approval (Chromium)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import Approval
from tests.browser.a11y import AxeReport
from tests.browser.conftest import Contexts, login, open_review, propose, wait_for_state
from tests.conftest import REFUND_ARGS, Runtime, approve

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = os.environ.get("CONSOLE_SHOTS_DIR", "")


def test_edit_after_approval_says_it_withdraws_the_approval(
    contexts: Contexts, runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    approve(occurrence_id, reviewer)
    page = contexts.new(bypass_csp=True).new_page()
    login(page, second_reviewer.username)
    open_review(page, occurrence_id)
    summary = page.locator("#edit-section summary")
    expect(summary).to_contain_text("Edit and withdraw this approval…")
    summary.click()
    expect(page.locator("#edit-withdraws")).to_contain_text("withdraws the approval of version 1")
    axe = AxeReport()
    axe.check(page, "review page, edit and withdraw open")
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "edit-withdraw.png"), full_page=True)
    page.locator("#edit-form textarea[name=arguments]").fill(
        json.dumps({**REFUND_ARGS, "amount_minor": 7000})
    )
    with page.expect_navigation():
        page.get_by_role("button", name="Withdraw the approval and save version 2").click()
    wait_for_state(page, "pending")
    assert Approval.objects.get(occurrence_id=occurrence_id).superseded_at is not None
    axe.assert_clean()
