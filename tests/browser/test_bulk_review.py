"""Bulk review in the browser: a reviewer ticks ten requests in the inbox, reads them on one
page and approves them together (ten approvals, each bound to its own digest); a second
batch, one of whose requests another reviewer edits after the page rendered, is refused
whole, and the page names that request.

Run with UPDATE_SCREENSHOTS=1 to write docs/bulk-review.png (otherwise the picture goes to
the test's temporary directory)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Approval, AuditEvent, Occurrence, Proposal
from tests.browser.a11y import AxeReport, live_regions, sideways_overflow
from tests.browser.conftest import Contexts, login, open_review, propose
from tests.conftest import REFUND_ARGS, Runtime

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS = Path(__file__).resolve().parents[2] / "docs"
MESSAGE = {"to": "dana@example.com", "subject": "Your refund", "body": "It is on its way."}
REASONS = ["Damaged parcel", "Late delivery", "Damaged parcel", "Wrong size", "Damaged parcel"]


def refund(runtime: Runtime, n: int) -> str:
    return propose(
        runtime,
        arguments={
            **REFUND_ARGS,
            "payment_id": f"pay_{7300 + n}",
            "amount_minor": 1500 + 250 * (n % 4),
            "reason": REASONS[n % len(REASONS)],
        },
        run_id="run-returns-0412",
        reason="A batch of returns from this morning's queue.",
    )


def current(occurrence_id: str) -> Proposal:
    return Proposal.objects.get(occurrence_id=occurrence_id, is_current=True)


def select_in_inbox(page: Page, ids: list[str]) -> None:
    """Tick ``ids`` in the inbox filtered to refunds and open them in bulk review."""
    page.goto("/reviews/?tool=issue_refund")
    for occurrence_id in ids:
        page.locator(f"#select-{occurrence_id}").check()
    expect(page.locator("#review-selected")).to_have_text(f"Review selected ({len(ids)})")
    with page.expect_navigation():
        page.locator("#review-selected").click()
    assert urlsplit(page.url).path == "/reviews/bulk/"
    expect(page.locator(".bulk-item")).to_have_count(len(ids))


def wait_for_version(occurrence_id: str, version: int, timeout: float = 15) -> None:
    give_up = time.monotonic() + timeout
    while current(occurrence_id).version != version:
        assert time.monotonic() < give_up, f"version {version} never came"
        time.sleep(0.1)


def test_ten_requests_approved_in_one_batch_and_a_changed_one_refuses_the_next(
    contexts: Contexts,
    runtime: Runtime,
    reviewer: Any,
    second_reviewer: Any,
    tmp_path: Path,
) -> None:
    batch = [refund(runtime, n) for n in range(10)]
    other_tool = propose(runtime, "send_message", arguments=MESSAGE)
    page = contexts.new(bypass_csp=True).new_page()
    login(page, reviewer.username)

    select_in_inbox(page, batch)
    expect(page.locator(f"#select-{other_tool}")).to_have_count(0)  # filtered out
    expect(page.locator("#bulk")).to_contain_text("At most 50 requests per batch")
    for occurrence_id in batch:
        expect(page.locator(f"#bulk-{occurrence_id} .bulk-digest")).to_have_text(
            current(occurrence_id).action_digest
        )
    expect(page.locator("#bulk-differences")).to_contain_text("payment_id")
    expect(page.locator("#bulk-differences")).not_to_contain_text("currency")
    first = page.locator(f"#bulk-{batch[0]}")
    first.locator("details summary").click()
    expect(first.locator("pre")).to_contain_text('"payment_id": "pay_7300"')
    expect(first.locator("mark.bulk-diff").first).to_be_visible()
    # The two at the top, open for the picture.
    page.locator(".bulk-item details summary").nth(0).click()
    page.locator(".bulk-item details summary").nth(1).click()

    axe = AxeReport()
    axe.check(page, "bulk review")
    assert len(live_regions(page)) == 1, live_regions(page)
    shots = DOCS if os.environ.get("UPDATE_SCREENSHOTS") else tmp_path
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(shots / "bulk-review.png"))

    with page.expect_navigation():
        page.locator("#bulk-approve").click()
    expect(page.locator("#bulk-message")).to_contain_text("Approved 10 of 10 requests")
    expect(page.locator("#bulk-approve")).to_have_count(0)

    approvals = list(Approval.objects.filter(occurrence_id__in=batch))
    assert len(approvals) == 10
    for approval in approvals:
        assert approval.action_digest == current(str(approval.occurrence_id)).action_digest
        assert approval.proposal_id == current(str(approval.occurrence_id)).pk
    assert len({approval.action_digest for approval in approvals}) == 10
    issued = AuditEvent.objects.filter(occurrence_id__in=batch, kind="approval.issued")
    assert len({event.data["batch"] for event in issued}) == 1 and issued.count() == 10
    assert Occurrence.objects.get(pk=other_tool).status == Occurrence.Status.PENDING_REVIEW

    # The second batch: another reviewer edits one of them after the page rendered.
    second = [refund(runtime, n) for n in range(10, 13)]
    select_in_inbox(page, second)
    changed = second[1]
    editor = contexts.new().new_page()
    login(editor, second_reviewer.username)
    open_review(editor, changed)
    editor.locator("#edit-section summary").click()
    editor.locator("#edit-arguments").fill(
        '{"payment_id": "pay_7311", "amount_minor": 99, "currency": "EUR", "reason": "Edited"}'
    )
    editor.locator("#edit-form [type=submit]").click()
    wait_for_version(changed, 2)

    with page.expect_navigation():
        page.locator("#bulk-approve").click()
    message = page.locator("#bulk-message")
    expect(message).to_contain_text(f"request {changed[:8]} stopped the batch")
    expect(message).to_contain_text("version 1 was shown, version 2 is current")
    expect(page.locator(f"#bulk-{changed}")).to_have_class(re.compile(r"bulk-item--refused"))
    expect(page.locator(f"#bulk-{changed}")).to_contain_text("version 2")
    assert not Approval.objects.filter(occurrence_id__in=second).exists()
    assert set(Occurrence.objects.filter(pk__in=second).values_list("status", flat=True)) == {
        Occurrence.Status.PENDING_REVIEW
    }
    axe.check(page, "bulk review, refused")
    axe.assert_clean()


def test_the_bulk_page_does_not_scroll_sideways_at_200_percent(
    contexts: Contexts, runtime: Runtime, reviewer: Any
) -> None:
    ids = [refund(runtime, n) for n in range(3)]
    page = contexts.new(width=640, bypass_csp=True).new_page()
    login(page, reviewer.username)
    page.goto("/reviews/bulk/?" + "&".join(f"ids={pk}" for pk in ids))
    for pk in ids:
        page.locator(f"#bulk-{pk} details summary").click()
    assert sideways_overflow(page) <= 0
    axe = AxeReport()
    axe.check(page, "bulk review at 640 px")
    axe.assert_clean()


def test_the_ticks_survive_the_inbox_refreshing_itself(
    contexts: Contexts, runtime: Runtime, reviewer: Any
) -> None:
    ids = [refund(runtime, n) for n in range(3)]
    page = contexts.new().new_page()
    login(page, reviewer.username)
    page.goto("/reviews/")
    page.locator(f"#select-{ids[0]}").check()
    page.locator(f"#select-{ids[2]}").check()
    newer = refund(runtime, 3)  # the list changes: the poll swaps it in
    expect(page.locator(f"#select-{newer}")).to_be_visible(timeout=20_000)
    expect(page.locator(f"#select-{ids[0]}")).to_be_checked()
    expect(page.locator(f"#select-{ids[2]}")).to_be_checked()
    expect(page.locator(f"#select-{ids[1]}")).not_to_be_checked()
    expect(page.locator("#review-selected")).to_have_text("Review selected (2)")
