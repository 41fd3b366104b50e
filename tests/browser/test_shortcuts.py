"""Keyboard shortcuts in Chromium: j/k move through the inbox's and the queue's rows, o
opens, a/r on a review page go to Approve and the rejection's reason without deciding,
/ goes to the filters, ? lists them; none fires while typing; each is announced."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Command, Membership, Occurrence, Tenant
from tests.browser.a11y import AxeReport
from tests.browser.conftest import Contexts, login, propose
from tests.conftest import REFUND_ARGS, Runtime, approve, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = os.environ.get("CONSOLE_SHOTS_DIR", "")


def _focused_href(page: Page) -> str:
    return str(page.evaluate("document.activeElement.getAttribute('href') || ''"))


def _announced(page: Page) -> Any:
    return expect(page.locator("#live-announcer"))


def test_a_reviewer_works_through_the_inbox_by_keyboard(
    contexts: Contexts, runtime: Runtime, reviewer: Any
) -> None:
    ids = [propose(runtime, arguments=dict(REFUND_ARGS, payment_id=f"pay_{n}")) for n in range(3)]
    newest_first = list(reversed(ids))
    page = contexts.new(bypass_csp=True).new_page()
    axe = AxeReport()
    login(page, reviewer.username)
    page.goto("/reviews/")
    expect(page.locator("#inbox-count")).to_have_text("3")

    page.keyboard.press("j")
    assert _focused_href(page) == f"/reviews/{newest_first[0]}/"
    _announced(page).to_have_text("Row 1 of 3.")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("j")  # stays on the last row
    assert _focused_href(page) == f"/reviews/{newest_first[2]}/"
    page.keyboard.press("k")
    assert _focused_href(page) == f"/reviews/{newest_first[1]}/"
    _announced(page).to_have_text("Row 2 of 3.")

    page.keyboard.press("/")
    expect(page.locator("#filter-tool")).to_be_focused()
    page.locator("#filter-tool").blur()

    page.keyboard.press("?")
    dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Next row")
    axe.check(page, "inbox, shortcuts listed")
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "shortcuts-dialog.png"))
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()

    page.keyboard.press("j")  # from the second row, the third
    with page.expect_navigation():
        page.keyboard.press("o")
    expect(page).to_have_url(re.compile(f"/reviews/{newest_first[2]}/$"))

    # On the review page: a and r go to the controls and decide nothing.
    page.keyboard.press("a")
    expect(page.locator("#approve-button")).to_be_focused()
    _announced(page).to_contain_text("Approve button")
    page.keyboard.press("r")
    expect(page.locator("#reject-reason")).to_be_focused()
    # Typing in a field is typing: "jar" is text, not three shortcuts.
    page.keyboard.type("jar?o")
    expect(page.locator("#reject-reason")).to_have_value("jar?o")
    expect(page.locator("#reject-reason")).to_be_focused()
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(page).to_have_url(re.compile(f"/reviews/{newest_first[2]}/$"))
    assert Occurrence.objects.get(pk=newest_first[2]).status == "pending_review"
    axe.check(page, "review page after a and r")
    axe.assert_clean()


def test_an_operator_opens_a_queue_item_by_keyboard(
    contexts: Contexts, tenant: Tenant, runtime: Runtime, reviewer: Any
) -> None:
    make_user("otto", tenant, Membership.Role.OPERATOR)
    occurrence_id = propose(runtime)
    approve(occurrence_id, reviewer)
    token = runtime.token(occurrence_id).json()["token"]
    assert runtime.claim(token, "exec-1").json()["decision"] == "approved"
    Command.objects.filter(occurrence_id=occurrence_id).update(state=Command.State.OUTCOME_UNKNOWN)
    page = contexts.new().new_page()
    login(page, "otto")
    page.goto("/operations/")
    page.keyboard.press("j")
    _announced(page).to_have_text("Row 1 of 1.")
    assert occurrence_id in _focused_href(page)
    with page.expect_navigation():
        page.keyboard.press("o")
    expect(page).to_have_url(re.compile(f"/operations/occurrences/{occurrence_id}/"))
