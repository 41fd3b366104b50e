"""Two reviewers press Approve on the same request at the same moment."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, Response, Route, expect

from approvals.models import Approval, AuditEvent
from tests.browser.conftest import Contexts, login, open_review, propose, wait_for_state
from tests.conftest import Runtime

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


def _is_approve_post(url: str) -> bool:
    return url.rstrip("/").endswith("/approve")


def test_two_reviewers_approving_at_once_issue_one_approval(
    contexts: Contexts, runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    pages: list[Page] = []
    for user in (reviewer, second_reviewer):
        page = contexts.new().new_page()
        login(page, user.username)
        open_review(page, occurrence_id)
        pages.append(page)

    # Hold both approve requests in the browsers, then release them together, so that
    # they reach the server's threads at the same moment rather than one click apart.
    held: list[Route] = []
    responses: list[Response] = []
    for page in pages:
        # Playwright wants Python functions as handlers, not bound builtins like list.append.
        page.route(_is_approve_post, lambda route: held.append(route))
        page.on("response", lambda r: responses.append(r) if _is_approve_post(r.url) else None)
    for page in pages:
        page.locator("#approve-form").get_by_role("button", name="Approve").click()
    for _ in range(200):
        if len(held) == 2:
            break
        pages[0].wait_for_timeout(25)
    assert len(held) == 2, "both approve requests should have left the browsers"
    for route in held:
        route.continue_()

    for page in pages:
        wait_for_state(page, "issued")
        expect(page.locator("#action-digest")).to_be_visible()
        expect(page.locator("#approve-form")).to_have_count(0)
        body = page.locator("body").inner_text()
        assert "Server Error" not in body
        assert "Forbidden" not in body

    assert len(responses) == 2
    assert all(r.status < 500 for r in responses), [r.status for r in responses]
    assert Approval.objects.filter(occurrence_id=occurrence_id).count() == 1
    assert (
        AuditEvent.objects.filter(occurrence_id=occurrence_id, kind="approval.issued").count() == 1
    )
