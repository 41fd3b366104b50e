"""A reviewer sees a request escalated (its review deadline passed) on the inbox and the
review page, and then, after the final deadline, the page turns to timed out by itself and
offers no approve button."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from approvals.models import Occurrence, ToolContract
from approvals.reviews.deadlines import review_deadlines_apply
from tests.browser.a11y import axe_violations
from tests.browser.conftest import Contexts, login, open_review, panel, propose, wait_for_state
from tests.conftest import Runtime

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_escalated_request_is_badged_then_times_out_without_an_approve_button(
    contexts: Contexts, runtime: Runtime, reviewer: Any
) -> None:
    # axe-core is injected as a script: the page's CSP would refuse it.
    page: Page = contexts.new(bypass_csp=True).new_page()
    ToolContract.objects.filter(name="issue_refund").update(
        review_deadline=timedelta(minutes=30), final_deadline=timedelta(hours=1)
    )
    occurrence_id = propose(runtime)
    now = timezone.now()
    Occurrence.objects.filter(pk=occurrence_id).update(
        created_at=now - timedelta(minutes=35), review_deadline_at=now - timedelta(minutes=5)
    )
    assert review_deadlines_apply() == (1, 0)

    login(page, reviewer.username)
    page.goto("/reviews/")
    row = page.locator(f"tr[data-occurrence-id='{occurrence_id}']")
    expect(row.locator(".badge--escalated")).to_have_text("Escalated: waiting 35 min")
    assert axe_violations(page) == []

    open_review(page, occurrence_id)
    expect(page.locator("#escalated")).to_contain_text("Escalated: waiting 35 min")
    expect(page.locator("#approve-button")).to_be_visible()
    assert axe_violations(page) == []

    Occurrence.objects.filter(pk=occurrence_id).update(
        final_deadline_at=timezone.now() - timedelta(seconds=1)
    )
    assert review_deadlines_apply() == (0, 1)

    # The panel's poll brings the timeout in, without a reload.
    wait_for_state(page, "timed_out")
    expect(panel(page).locator("#timed-out")).to_contain_text("Timed out")
    expect(page.locator("#occurrence-status")).to_have_text("Timed out")
    expect(page.locator("#approve-button")).to_have_count(0)
    expect(page.locator("#reject-button")).to_have_count(0)
    assert axe_violations(page) == []
