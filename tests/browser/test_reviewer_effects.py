"""A reviewer sees what their approvals came to: the effect beside "Consumed" in the inbox
and on the review page, and the list of their approvals that went wrong."""

from __future__ import annotations

import os
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Command
from tests.browser.a11y import AxeReport
from tests.browser.conftest import Contexts, login, propose
from tests.conftest import REFUND_ARGS, Runtime, approve

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Where to keep screenshots for a person to look at (unset: none are taken).
SHOTS = os.environ.get("CONSOLE_SHOTS_DIR", "")


def _consumed(runtime: Runtime, reviewer: Any, payment: str, state: str) -> str:
    arguments = dict(REFUND_ARGS, payment_id=payment)
    occurrence_id = propose(runtime, arguments=arguments)
    assert approve(occurrence_id, reviewer).issued
    token = runtime.token(occurrence_id).json()["token"]
    claimed = runtime.claim(token, f"exec-{payment}", arguments=arguments)
    assert claimed.json()["decision"] == "approved", claimed.content
    Command.objects.filter(occurrence_id=occurrence_id).update(state=state)
    return occurrence_id


def _shot(page: Page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)


def test_a_reviewer_finds_the_approvals_that_went_wrong_and_their_effect(
    contexts: Contexts, runtime: Runtime, reviewer: Any
) -> None:
    page = contexts.new(bypass_csp=True).new_page()  # axe-core is injected
    good = _consumed(runtime, reviewer, "pay_good", Command.State.COMMITTED)
    unknown = _consumed(runtime, reviewer, "pay_unknown", Command.State.OUTCOME_UNKNOWN)
    axe = AxeReport()

    login(page, reviewer.username)
    page.goto("/reviews/?state=consumed")
    row = page.locator(f'tr[data-occurrence-id="{good}"]')
    expect(row.locator(".cell-state .badge")).to_have_text("Consumed · committed")
    expect(page.locator(f'tr[data-occurrence-id="{unknown}"] .cell-state .badge')).to_have_text(
        "Consumed · outcome unknown"
    )
    axe.check(page, "inbox, consumed with effects")
    _shot(page, "inbox-consumed")

    with page.expect_navigation():
        page.get_by_role("link", name="My approvals that went wrong").click()
    expect(page.locator("#inbox-summary")).to_contain_text("1 of my approvals went wrong")
    expect(page.locator(f'tr[data-occurrence-id="{good}"]')).to_have_count(0)
    wrong = page.locator(f'tr[data-occurrence-id="{unknown}"]')
    expect(wrong).to_be_visible()
    expect(page.locator("#filter-state")).to_have_value("went_wrong")
    axe.check(page, "inbox, my approvals that went wrong")
    _shot(page, "inbox-went-wrong")

    with page.expect_navigation():
        wrong.get_by_role("link").click()
    expect(page.locator("#occurrence-status")).to_have_text("Consumed · outcome unknown")
    axe.check(page, "review page, consumed with an unknown outcome")
    _shot(page, "review-outcome-unknown")
    axe.assert_clean()
