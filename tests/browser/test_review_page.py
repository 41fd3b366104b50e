"""The review page in a real browser: what a reviewer sees, and that it stays true while
the runtime acts on the other side of the API."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.audit.record import audit_record
from approvals.canonical.form import canonicalize
from approvals.models import Approval, ApprovalVote, Command, Occurrence
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from tests.browser.conftest import (
    Contexts,
    login,
    open_review,
    panel,
    propose,
    track_navigations,
    wait_for_state,
)
from tests.conftest import REFUND_ARGS, Runtime, approve

pytestmark = [
    pytest.mark.browser,
    # The live server answers from its own thread and connection, so the test's writes
    # must be committed (tests/conftest.py reinstalls the shipped tool contracts that the
    # flush after each transactional test removes).
    pytest.mark.django_db(transaction=True),
]


def test_digest_shown_is_the_apis_and_rederives_from_the_shown_json(
    page: Page, runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    api_digest = runtime.get(f"/api/v1/occurrences/{occurrence_id}").json()["proposal"][
        "action_digest"
    ]

    login(page, reviewer.username)
    open_review(page, occurrence_id)

    assert page.locator("#action-digest").text_content() == api_digest
    shown = json.loads(page.locator("#canonical-action").text_content() or "")
    assert set(shown) == {"tool", "arguments"}
    assert canonicalize(shown["tool"], shown["arguments"]).digest == api_digest
    assert shown["arguments"] == REFUND_ARGS
    expect(page.locator("#agent-reason")).to_have_text("The customer asked for it.")


def test_approve_then_runtime_claim_turns_panel_consumed_without_reload(
    page: Page, runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    login(page, reviewer.username)
    open_review(page, occurrence_id)
    review_url = page.url
    wait_for_state(page, "pending")
    # The panel is not a live region: the page's one region says what changed.
    expect(page.locator("#live-announcer")).to_have_attribute("aria-live", "polite")

    navigations = track_navigations(page)
    # A marker on window survives only if the document is never reloaded.
    page.evaluate("window.__sameDocument = true")

    page.locator("#approve-form").get_by_role("button", name="Approve").click()
    wait_for_state(page, "issued")
    expect(page.locator("#approve-form")).to_have_count(0)
    expect(page.locator("#reject-form")).to_have_count(0)
    assert Approval.objects.filter(occurrence_id=occurrence_id).count() == 1

    # The runtime acts through the API while the page sits there polling.
    pickup = runtime.token(occurrence_id)
    assert pickup.status_code == 200, pickup.content
    claim = runtime.claim(pickup.json()["token"], "exec-browser-1")
    assert claim.status_code == 200, claim.content
    assert claim.json()["decision"] == "approved"
    command_id = claim.json()["command_id"]
    idempotency_key = claim.json()["idempotency_key"]

    wait_for_state(page, "consumed")
    expect(panel(page)).to_contain_text("exec-browser-1")
    expect(panel(page)).to_contain_text(command_id)
    expect(panel(page)).to_contain_text(idempotency_key)
    # The raw token never reaches a page.
    assert pickup.json()["token"] not in page.content()

    assert page.url == review_url
    assert navigations.urls == []
    assert page.evaluate("window.__sameDocument") is True

    # The panel keeps polling while the command can still change, and shows its outcome
    # (here written as a worker would); once the command has settled, polling stops.
    Command.objects.filter(pk=command_id).update(state=Command.State.COMMITTED)
    expect(panel(page)).to_contain_text("Committed")
    page.wait_for_timeout(500)
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "/panel" in r.url else None)
    page.wait_for_timeout(5_000)
    assert polls == []


def test_approving_a_stale_digest_is_refused_and_shows_the_new_version(
    page: Page, runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    login(page, reviewer.username)
    open_review(page, occurrence_id)
    old_digest = page.locator("#action-digest").text_content()

    # Someone else edits the proposal after the page was opened.
    edited = proposal_edit(
        occurrence=Occurrence.objects.get(pk=occurrence_id),
        editor=second_reviewer,
        arguments={**REFUND_ARGS, "amount_minor": 6000},
        seen_digest=old_digest or "",
    )

    page.locator("#approve-form").get_by_role("button", name="Approve").click()

    expect(page.locator("#decision-message")).to_contain_text(re.compile("changed", re.I))
    expect(page.locator("#live-announcer")).to_contain_text(re.compile("changed", re.I))
    expect(page.locator("#version-diff")).to_be_visible()
    expect(page.locator("#action-digest")).to_have_text(edited.action_digest)
    expect(page.locator("#canonical-action")).to_contain_text("6000")
    wait_for_state(page, "pending")
    assert not Approval.objects.filter(occurrence_id=occurrence_id).exists()
    assert not ApprovalVote.objects.filter(proposal__occurrence_id=occurrence_id).exists()


def test_rejection_reason_reaches_the_agent(page: Page, runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = propose(runtime)
    reason = "Payment pay_123 was already refunded last week."
    login(page, reviewer.username)
    open_review(page, occurrence_id)

    page.locator("#reject-form textarea[name=reason]").fill(reason)
    page.locator("#reject-form").get_by_role("button", name="Reject").click()

    wait_for_state(page, "rejected")
    expect(panel(page)).to_contain_text(reason)
    expect(page.locator("#approve-form")).to_have_count(0)
    pickup = runtime.token(occurrence_id)
    assert pickup.status_code == 409, pickup.content
    error = pickup.json()["error"]
    assert error["code"] == "rejected"
    assert reason in error["message"]
    assert not Approval.objects.filter(occurrence_id=occurrence_id).exists()


def test_refund_above_threshold_needs_a_second_reviewer(
    contexts: Contexts, runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = propose(runtime, arguments={**REFUND_ARGS, "amount_minor": 60000})
    first = contexts.new().new_page()
    second = contexts.new().new_page()
    login(first, reviewer.username)
    login(second, second_reviewer.username)
    open_review(first, occurrence_id)
    open_review(second, occurrence_id)

    first.locator("#approve-form").get_by_role("button", name="Approve").click()
    wait_for_state(first, "awaiting_quorum")
    expect(first.locator("#quorum")).to_have_text(re.compile(r"\b1 of 2 approvals\b"))
    assert not Approval.objects.filter(occurrence_id=occurrence_id).exists()
    assert ApprovalVote.objects.filter(proposal__occurrence_id=occurrence_id).count() == 1

    # The second reviewer's page learns about the first vote by polling.
    wait_for_state(second, "awaiting_quorum")
    expect(second.locator("#quorum")).to_have_text(re.compile(r"\b1 of 2 approvals\b"))
    second.locator("#approve-form").get_by_role("button", name="Approve").click()
    wait_for_state(second, "issued")
    assert Approval.objects.filter(occurrence_id=occurrence_id).count() == 1

    wait_for_state(first, "issued")


def test_edit_form_goes_away_when_the_request_is_decided_elsewhere(
    page: Page, runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    login(page, reviewer.username)
    open_review(page, occurrence_id)
    # The edit form waits behind a closed disclosure, out of the way of the decision.
    expect(page.locator("#edit-form")).to_be_hidden()
    page.locator("#edit-section summary").click()
    expect(page.locator("#edit-form")).to_be_visible()

    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id),
        reviewer=second_reviewer,
        reason="Duplicate of an earlier refund.",
    )
    wait_for_state(page, "rejected")
    expect(page.locator("#edit-form")).to_have_count(0, timeout=3_000)


def test_saving_an_edit_after_the_claim_says_why_it_was_not_saved(
    contexts: Contexts, runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    # Without JavaScript nothing polls, so the form stays as it was when the page loaded,
    # exactly as for a reviewer whose page has not polled yet.
    context = contexts.browser.new_context(base_url=contexts.base_url, java_script_enabled=False)
    contexts.opened.append(context)
    page = context.new_page()
    occurrence_id = propose(runtime)
    login(page, reviewer.username)
    open_review(page, occurrence_id)

    approve(occurrence_id, second_reviewer)
    token = runtime.token(occurrence_id).json()["token"]
    assert runtime.claim(token, "exec-1").status_code == 200

    page.locator("#edit-section summary").click()
    page.locator("#edit-form textarea[name=arguments]").fill(
        json.dumps({**REFUND_ARGS, "amount_minor": 7000})
    )
    page.locator("#edit-form").get_by_role("button", name="Save as new version").click()
    expect(page.locator("main")).to_contain_text(re.compile("can no longer be edited", re.I))


def _notes(occurrence_id: str, count: int, start: int = 0) -> None:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    for n in range(start, start + count):
        audit_record(
            kind="test.note",
            tenant=occurrence.tenant_id,
            occurrence=occurrence,
            actor="tester",
            data={"reason": f"note {n}"},
        )


def test_a_long_history_pages_back_by_keyboard_and_keeps_its_window_while_polling(
    page: Page, runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(runtime)  # pending: the panel polls every couple of seconds
    _notes(occurrence_id, 120)  # with occurrence.proposed: 121 events
    login(page, reviewer.username)
    open_review(page, occurrence_id)
    history = page.locator("#history")
    expect(history.locator("h2")).to_contain_text("latest 50 of 121 events, oldest first")
    expect(history.locator("tbody.history-event")).to_have_count(50)

    # By keyboard: the pager's links are ordinary links, in reading order.
    pager = page.get_by_role("navigation", name="History pages")
    expect(pager.get_by_role("link")).to_have_text(["Oldest events", "← Earlier events"])
    pager.get_by_role("link", name="← Earlier events").focus()
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert "before=" in page.url and page.url.endswith("#history")
    expect(history.locator("h2")).to_contain_text("events 22 to 71 of 121, oldest first")
    expect(history).to_contain_text("note 20")
    expect(history).not_to_contain_text("note 70")

    # A new event: the poll brings the panel and the same window, one more event counted,
    # and the link that had focus keeps it.
    pager.get_by_role("link", name="← Earlier events").focus()
    _notes(occurrence_id, 1, start=120)
    expect(history.locator("h2")).to_contain_text("events 22 to 71 of 122", timeout=10_000)
    expect(history).to_contain_text("note 20")
    expect(page.locator("#history-earlier")).to_be_focused()
    expect(pager.get_by_role("link")).to_have_text(
        ["← Earlier events", "Later events →", "Latest events"]
    )
    with page.expect_navigation():
        pager.get_by_role("link", name="Latest events").click()
    expect(history.locator("h2")).to_contain_text("latest 50 of 122 events")
    expect(history).to_contain_text("note 120")
