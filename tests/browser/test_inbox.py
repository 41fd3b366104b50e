"""The inbox: what is waiting, filtered, and kept fresh without reloading."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import login, propose, track_navigations
from tests.conftest import Runtime

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

MESSAGE = {"to": "dana@example.com", "subject": "Your refund", "body": "It is on its way."}


def _row(page: Page, occurrence_id: str) -> Any:
    return page.locator(f'tr[data-occurrence-id="{occurrence_id}"]')


def _count(n: int) -> re.Pattern[str]:
    return re.compile(rf"(^|\D){n}(\D|$)")


def test_inbox_lists_filters_and_picks_up_new_requests_without_reload(
    page: Page, runtime: Runtime, reviewer: Any
) -> None:
    refund = propose(runtime)
    message = propose(runtime, "send_message", arguments=MESSAGE)

    login(page, reviewer.username)
    page.goto("/reviews/")
    expect(page.locator("#inbox-count")).to_have_text(_count(2))
    for occurrence_id in (refund, message):
        expect(
            _row(page, occurrence_id).locator(f'a[href="/reviews/{occurrence_id}/"]')
        ).to_be_visible()

    filters = page.locator("#inbox-filters")
    filters.locator("select[name=tool]").select_option("send_message")
    submit = filters.locator("[type=submit]")
    if submit.count():
        submit.first.click()
    expect(_row(page, refund)).to_have_count(0)
    expect(_row(page, message)).to_be_visible()
    expect(page.locator("#inbox-count")).to_have_text(_count(1))

    # A new request arrives while the reviewer looks at the filtered list.
    navigations = track_navigations(page)
    page.evaluate("window.__sameDocument = true")
    newer = propose(runtime, "send_message", arguments={**MESSAGE, "subject": "Your refund, again"})
    expect(_row(page, newer)).to_be_visible(timeout=15_000)
    expect(page.locator("#inbox-count")).to_have_text(_count(2))
    expect(_row(page, refund)).to_have_count(0)
    assert navigations.urls == []
    assert page.evaluate("window.__sameDocument") is True

    with page.expect_navigation():
        _row(page, newer).locator(f'a[href="/reviews/{newer}/"]').click()
    expect(page.locator("#canonical-action")).to_contain_text("Your refund, again")
