"""What updates by itself keeps the keyboard and the screen reader: focus stays on the
same control (or its replacement) when the inbox or the decision panel is swapped by its
poll, and the page's one polite live region says each change once, security events
included. The state changes happen on the server (the API, the services), as they would
while a reviewer has the page open."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Approval
from approvals.reviews.revocation import approval_revoke
from tests.browser.a11y import (
    active_element,
    announced,
    assert_one_polite_live_region,
    record_announcements,
)
from tests.browser.conftest import login, open_review, propose, wait_for_state
from tests.conftest import REFUND_ARGS, Runtime, approve

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The inbox polls every 5 s, the panel every 2 s.
POLL_TIMEOUT_MS = 15_000


def _expect_said(page: Page, expected: list[str]) -> None:
    """The live region has said exactly these, in this order, each once."""
    page.wait_for_function(
        "(n) => window.__announced.length >= n", arg=len(expected), timeout=POLL_TIMEOUT_MS
    )
    page.wait_for_timeout(300)  # anything said twice would be said by now
    assert announced(page) == expected


def _link(occurrence_id: str) -> str:
    return f"#review-link-{occurrence_id}"


def _state(page: Page) -> str:
    """The panel's state as its badge words it, as a sentence."""
    return page.locator("#decision-panel .card-head .badge").inner_text().strip() + "."


def _pending(page: Page, n: int) -> str:
    """What the inbox says of its count: "3 pending review."."""
    label = page.locator("#filter-state option:checked").inner_text().strip().lower()
    return f"{n} {label}."


def test_inbox_poll_keeps_focus_on_the_review_link_or_its_replacement(
    page: Page, runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    oldest, middle = propose(runtime, client_ref="a"), propose(runtime, client_ref="b")
    login(page, reviewer.username)
    page.goto("/reviews/")
    assert_one_polite_live_region(page)
    record_announcements(page)
    page.locator(_link(oldest)).focus()
    assert active_element(page) == f"a#review-link-{oldest}"

    # A new request arrives: the list is swapped, focus stays on the same link.
    newest = propose(runtime, client_ref="c")
    expect(page.locator(_link(newest))).to_be_visible(timeout=POLL_TIMEOUT_MS)
    assert active_element(page) == f"a#review-link-{oldest}"
    said = [_pending(page, 3)]
    _expect_said(page, said)

    # Its request is approved elsewhere and leaves the list: focus moves to the link that
    # took its place (the list is newest first), not to <body>.
    approve(oldest, second_reviewer)
    expect(page.locator(_link(oldest))).to_have_count(0, timeout=POLL_TIMEOUT_MS)
    assert active_element(page) == f"a#review-link-{middle}"
    said.append(_pending(page, 2))
    _expect_said(page, said)

    # The rest go too: focus lands on the list's summary, which says so.
    approve(middle, second_reviewer)
    approve(newest, second_reviewer)
    expect(page.locator("#inbox-count")).to_have_text("0", timeout=POLL_TIMEOUT_MS)
    assert active_element(page) == "p#inbox-summary"
    said.append(_pending(page, 0))
    _expect_said(page, said)
    assert_one_polite_live_region(page)

    # The keyboard goes on from there, not from "Skip to content": back to the filters
    # (whose last stop is the link to my approvals that went wrong).
    page.keyboard.press("Shift+Tab")
    assert page.evaluate("document.activeElement.closest('form')?.id") == "inbox-filters"
    assert active_element(page) == "a#went-wrong-link"


def test_the_decision_panel_keeps_focus_and_says_each_change_once(
    page: Page, runtime: Runtime, reviewer: Any, admin_user: Any
) -> None:
    occurrence_id = propose(runtime)
    approve(occurrence_id, reviewer)
    login(page, admin_user.username)
    open_review(page, occurrence_id)
    wait_for_state(page, "issued")
    assert_one_polite_live_region(page)
    record_announcements(page)

    # Token delivered while the admin is on the Revoke button: still on it afterwards.
    page.locator("#revoke-button").focus()
    token = runtime.token(occurrence_id).json()["token"]
    wait_for_state(page, "delivered")
    assert active_element(page) == "button#revoke-button"
    said = [_state(page)]
    _expect_said(page, said)

    # Typing a reason when the execution consumes the approval: the form is gone, focus
    # goes to the panel's heading rather than to <body>.
    page.locator("#revoke-reason").fill("Wrong acc")
    page.locator("#revoke-reason").focus()
    assert runtime.claim(token, "exec-a").json()["decision"] == "approved"
    wait_for_state(page, "consumed")
    expect(page.locator("#revoke-form")).to_have_count(0)
    assert active_element(page) == "h2#decision-h"
    said.append(_state(page))
    _expect_said(page, said)

    # A replay from another execution is refused: shown, and said, once.
    assert runtime.claim(token, "exec-b").status_code == 403
    expect(page.locator("#evidence-summary")).to_contain_text(
        "1 replay refused", timeout=POLL_TIMEOUT_MS
    )
    said.append("Security: 1 replay refused.")
    _expect_said(page, said)
    assert active_element(page) == "h2#decision-h"
    assert_one_polite_live_region(page)


def test_approve_is_said_once_and_a_preserved_reason_keeps_focus_and_text(
    page: Page, runtime: Runtime, reviewer: Any, second_reviewer: Any, admin_user: Any
) -> None:
    # Above EUR 500.00: two reviewers must approve.
    occurrence_id = propose(runtime, arguments={**REFUND_ARGS, "amount_minor": 60_000})
    login(page, reviewer.username)
    open_review(page, occurrence_id)
    wait_for_state(page, "pending")
    record_announcements(page)

    # Half-way through typing a rejection reason, the other reviewer approves: the panel is
    # swapped, the reason keeps its text and its focus (hx-preserve, same id).
    page.locator("#reject-reason").fill("Not sure about")
    page.locator("#reject-reason").focus()
    approve(occurrence_id, second_reviewer)
    wait_for_state(page, "awaiting_quorum")
    assert active_element(page) == "textarea#reject-reason"
    expect(page.locator("#reject-reason")).to_have_value("Not sure about")
    said = [_state(page)]
    _expect_said(page, said)

    # This reviewer completes the quorum: the answer is said once, not "Approved. Approved.",
    # and focus goes to the panel's heading (the button is gone).
    page.locator("#reject-reason").fill("")
    page.locator("#approve-button").click()
    wait_for_state(page, "issued")
    assert active_element(page) == "h2#decision-h"
    notice = page.locator("#decision-message").inner_text().strip()
    state = _state(page).rstrip(".")
    assert notice.startswith(state)  # "Approved. The approval is issued to the runtime."
    said.append(notice)
    _expect_said(page, said)
    assert said[-1].count(state) == 1

    # An admin revokes it elsewhere: said once, as the security event it is.
    assert approval_revoke(
        approval=Approval.objects.get(occurrence_id=occurrence_id),
        admin=admin_user,
        reason="Wrong account",
    )
    wait_for_state(page, "revoked")
    said.append(_state(page))
    _expect_said(page, said)
    assert active_element(page) == "h2#decision-h"
    assert_one_polite_live_region(page)
