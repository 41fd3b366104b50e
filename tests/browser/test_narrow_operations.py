"""At 200% zoom (640 px) the operations queue and the timeline are cards: nothing scrolls
sideways inside their tables, the queue's Amount and Open are in view, and the timeline's
actor is not squeezed to a character a line."""

from __future__ import annotations

import os
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Command, Membership, Tenant
from tests.browser.a11y import AxeReport, sideways_overflow
from tests.browser.conftest import Contexts, login, propose
from tests.conftest import Runtime, approve, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = os.environ.get("CONSOLE_SHOTS_DIR", "")
ZOOMED_WIDTH = 640


def _inner_overflow(page: Page, selector: str) -> int:
    overflow: int = page.evaluate(
        "(s) => { const w = document.querySelector(s).closest('.table-wrap');"
        " return w.scrollWidth - w.clientWidth; }",
        selector,
    )
    return overflow


def test_the_queue_and_the_timeline_are_cards_at_640_px(
    contexts: Contexts, tenant: Tenant, runtime: Runtime, reviewer: Any
) -> None:
    make_user("otto", tenant, Membership.Role.OPERATOR)
    occurrence_id = propose(runtime)
    approve(occurrence_id, reviewer)
    token = runtime.token(occurrence_id).json()["token"]
    assert runtime.claim(token, "exec-1").json()["decision"] == "approved"
    Command.objects.filter(occurrence_id=occurrence_id).update(state=Command.State.OUTCOME_UNKNOWN)
    page = contexts.new(width=ZOOMED_WIDTH, bypass_csp=True).new_page()
    axe = AxeReport()
    login(page, "otto")
    page.goto("/operations/")
    open_link = page.locator(".queue-table tbody a").first
    expect(open_link).to_be_in_viewport()
    expect(page.locator(".queue-table .money-chip").first).to_be_in_viewport()
    assert _inner_overflow(page, ".queue-table") <= 1
    assert sideways_overflow(page) == 0
    axe.check(page, "queue at 640 px")
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "queue-640.png"), full_page=True)

    open_link.click()
    expect(page.locator(".timeline-table")).to_be_visible()
    assert _inner_overflow(page, ".timeline-table") <= 1
    assert sideways_overflow(page) == 0
    # The actor cell of the runtime's events is as wide as its words, not one character.
    widths = page.evaluate(
        "() => Array.from(document.querySelectorAll('.timeline-table td.agent-text'))"
        ".filter((td) => td.textContent.trim().length >= 8)"
        ".map((td) => td.getBoundingClientRect().width)"
    )
    assert widths and min(widths) > 60, widths
    axe.check(page, "timeline at 640 px")
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "timeline-640.png"), full_page=True)
    axe.assert_clean()
