"""Issue 27 §3: a real MCP client handles the gateway's URL-mode elicitation by having a
reviewer approve the linked review page in Chromium; the call then runs once.

The test is a sync function: Playwright's sync API (the session's, tests/conftest.py) runs
its loop on the main thread, so the MCP client runs with ``asyncio.run`` in a thread of its
own and hands the elicited URL over through a queue. Nothing async touches this thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Command, Occurrence
from tests.browser import conftest as browser_fixtures
from tests.browser.conftest import login, wait_for_state
from tests.gateway.clients import Seen, call, text_of
from tests.gateway.conftest import Setup, in_thread

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

# The pages' fixtures of tests/browser, bound here (function-scoped: one context per test);
# the session's Playwright and Chromium under them are tests/conftest.py's, shared.
contexts = browser_fixtures.contexts
page = browser_fixtures.page

REFUND = {"order_id": "ord_42", "amount_minor": 4200, "currency": "EUR"}


def test_reviewer_approves_the_elicited_review_page_and_the_call_runs_once(
    gateway_setup: Setup, live_server: Any, page: Page, tmp_path: Path
) -> None:
    gateway_setup.write_config(console_url=live_server.url)
    gateway_setup.gateway.start()
    seen = Seen()
    client = in_thread(call(gateway_setup.gateway.url, "shop__issue_refund", REFUND, seen))

    url = seen.urls.get(timeout=60)
    (occurrence,) = Occurrence.objects.filter(tool__name="shop__issue_refund")
    assert url == f"{live_server.url}/reviews/{occurrence.pk}/"
    assert "needs a person's approval" in seen.elicitations[0].message

    login(page, gateway_setup.reviewer.username)
    page.goto(url)
    expect(page.locator("#action-digest")).to_be_visible()
    expect(page.locator("body")).to_contain_text("shop__issue_refund")
    expect(page.locator("body")).to_contain_text("ord_42")
    page.screenshot(path=str(tmp_path / "gateway-review.png"), full_page=True)
    page.locator("#approve-form").get_by_role("button", name="Approve").click()

    result = client.result()
    assert not result.is_error, text_of(result)
    assert "re_0" in text_of(result)
    assert seen.completed == [str(occurrence.pk)]
    (sent,) = gateway_setup.ledger.calls("issue_refund")
    command = Command.objects.get(occurrence=occurrence)
    assert sent["idempotency_key"] == command.idempotency_key
    assert command.state == Command.State.COMMITTED
    # The page follows the server: the approval it gave is consumed by the gateway's claim.
    wait_for_state(page, "consumed")
