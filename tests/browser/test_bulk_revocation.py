"""Bulk revocation in a real browser: an admin filters, checks the preview, confirms with a
reason; exactly the previewed approvals are revoked, and a claim of one of them then gets
``revoked``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Approval, AuditEvent, Membership, Tenant
from tests.browser.conftest import login, propose
from tests.conftest import REFUND_ARGS, Runtime, approve, make_user

pytestmark = [
    pytest.mark.browser,
    # The live server answers from its own thread and connection: the test's writes must
    # be committed.
    pytest.mark.django_db(transaction=True),
]

MESSAGE_ARGS = {"to": "dana@example.com", "subject": "Refund", "body": "On its way."}


def refund(amount: int, payment: str) -> dict[str, Any]:
    return dict(REFUND_ARGS, amount_minor=amount, payment_id=payment)


def test_an_admin_filters_previews_and_revokes_exactly_the_previewed_approvals(
    page: Page,
    tenant: Tenant,
    runtime: Runtime,
    reviewer: Any,
    second_reviewer: Any,
    tmp_path: Path,
) -> None:
    admin = make_user("ada", tenant, Membership.Role.ADMIN)
    refunds = [
        propose(runtime, arguments=refund(1250, "pay_a")),
        propose(runtime, arguments=refund(4999, "pay_b")),
    ]
    message = propose(runtime, "send_message", arguments=MESSAGE_ARGS)
    for occurrence_id in refunds:
        assert approve(occurrence_id, reviewer).issued
    assert approve(message, second_reviewer).issued
    # The runtime already holds the first refund's token.
    token = runtime.token(refunds[0]).json()["token"]

    login(page, admin.username)
    page.goto("/reviews/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Admin").click()
    expect(page).to_have_url(re.compile(r"/manage/revocations/$"))
    expect(page.get_by_role("heading", name="Revoke approvals", level=1)).to_be_visible()

    page.locator("#f-tool").select_option("issue_refund")
    page.locator("#f-approver").select_option("rita")
    page.get_by_role("button", name="Preview").click()

    expect(page.locator("#preview-count")).to_contain_text("2 approvals can be revoked")
    expect(page.locator("#preview-count")).to_contain_text("tool issue_refund, approved by rita")
    rows = page.locator("#preview tr[data-approval-id]")
    expect(rows).to_have_count(2)
    expect(page.locator("#preview")).to_contain_text("EUR 12.50")
    expect(page.locator("#preview")).to_contain_text("EUR 49.99")
    expect(page.locator("#preview")).not_to_contain_text("send_message")
    previewed = {int(rows.nth(n).get_attribute("data-approval-id") or 0) for n in range(2)}
    assert previewed == {Approval.objects.get(occurrence_id=pk).pk for pk in refunds}
    # Nothing is revoked by looking.
    assert set(Approval.objects.values_list("state", flat=True)) == {"issued"}

    confirm = page.locator("#confirm-button")
    expect(confirm).to_have_text("Revoke 2 approvals")
    page.locator("#confirm-reason").fill("Agent run 42 was compromised")
    confirm.click()

    expect(page).to_have_url(re.compile(r"/manage/revocations/batches/[0-9a-f-]{36}/$"))
    expect(page.locator("#result-summary")).to_contain_text(
        "Revoked 2 of the 2 approvals you previewed"
    )
    expect(page.locator("tr[data-outcome='revoked']")).to_have_count(2)
    expect(page.locator("#result")).to_contain_text("Agent run 42 was compromised")
    page.screenshot(path=str(tmp_path / "bulk-revocation-result.png"), full_page=True)

    assert {Approval.objects.get(occurrence_id=pk).state for pk in refunds} == {"revoked"}
    assert Approval.objects.get(occurrence_id=message).state == "issued"
    events = AuditEvent.objects.filter(kind="approval.revoked")
    assert {(e.actor, e.data["reason"]) for e in events} == {
        ("ada", "Agent run 42 was compromised")
    }
    # The runtime's claim of a revoked approval gets "revoked".
    claim = runtime.claim(token, "exec-1", arguments=refund(1250, "pay_a"))
    assert claim.status_code == 403
    assert claim.json()["decision"] == "revoked"

    # Back on the revocation page, the same filters find nothing more to revoke.
    page.get_by_role("link", name="Back to revocation").click()
    page.locator("#f-tool").select_option("issue_refund")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#preview-count")).to_contain_text("0 approvals can be revoked")
    expect(page.locator("#confirm-button")).to_have_count(0)
