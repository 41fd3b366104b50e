"""An investigation in Chromium: an operator searches a token fingerprint from the header's
link and reads the verdict at the top, with the facts behind it, then follows the chain to
the occurrence's timeline. UPDATE_SCREENSHOTS=1 writes the README's picture to
docs/investigation.png (otherwise to the test's temporary directory)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from approvals.models import Approval
from tests.browser.conftest import Contexts, login
from tests.browser.test_screenshots import _shoot
from tests.conftest import Runtime, approve, make_runtime

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS = Path(__file__).resolve().parents[2] / "docs"

REFUND = {
    "payment_id": "pay_4102",
    "amount_minor": 8000,
    "currency": "USD",
    "reason": "Parcel lost in transit",
}


def _claimed(runtime: Runtime, reviewer: Any, ref: str) -> tuple[str, str, str]:
    """A refund approved, its token picked up once and claimed by worker-a; then a second
    worker presents the same token and is refused. Returns occurrence, fingerprint, token."""
    proposed = runtime.propose(arguments=REFUND, client_ref=ref, run_id="run-4102")
    occurrence_id = proposed.json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    token = runtime.token(occurrence_id).json()["token"]
    won = runtime.claim(token, "worker-a", arguments=REFUND, message_id="msg-7731")
    assert won.json()["decision"] == "approved", won.content
    lost = runtime.claim(token, "worker-b", arguments=REFUND, message_id="msg-7732")
    assert lost.json()["decision"] == "replayed", lost.content
    fingerprint = Approval.objects.get(occurrence_id=occurrence_id).fingerprint
    return occurrence_id, fingerprint, token


def _ingest(producer: Runtime, *lines: dict[str, Any]) -> None:
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    response = producer.client.post(
        "/api/v1/audit/events", body, content_type="application/x-ndjson"
    )
    assert response.status_code == 200, response.content


def _search(page: Page, q: str) -> None:
    page.locator("#q").fill(q)
    with page.expect_navigation():
        page.locator("#investigate-form").get_by_role("button", name="Investigate").click()


def test_an_investigator_searches_a_fingerprint_and_sees_the_verdict(
    contexts: Contexts,
    runtime: Runtime,
    reviewer: Any,
    operator: Any,
    tenant: Any,
    tmp_path: Path,
) -> None:
    out = DOCS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path
    # One approval that the console's claim kept single-use...
    safe_occurrence, safe, safe_token = _claimed(runtime, reviewer, "r-safe")
    # ...and one that a legacy worker also reports as approved for its own execution,
    # in events its log shipper delivered to the console twice.
    occurrence_id, fingerprint, token = _claimed(runtime, reviewer, "r-4102")
    shipper = make_runtime(tenant, "legacy-log-shipper")
    legacy = {
        "event_id": str(uuid.uuid4()),
        "kind": "approval_decision",
        "fingerprint": fingerprint,
        "decision": "approved",
        "execution_id": "legacy-worker-9",
        "message_id": "sqs-5510",
        "command_id": str(uuid.uuid4()),
        "source_time": timezone.now().isoformat(),
    }
    _ingest(shipper, legacy)
    _ingest(shipper, legacy)

    page = contexts.new().new_page()
    login(page, operator.username)
    page.goto("/operations/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Investigate").click()
    expect(page.locator("#investigate-form")).to_be_visible()

    _search(page, safe)
    verdict = page.locator("#verdict")
    expect(verdict).to_contain_text("Control working")
    expect(verdict).to_contain_text("refused as replayed: worker-b")
    expect(page.locator("[data-verdict]")).to_have_count(1)

    _search(page, fingerprint)
    # The console's own records judge its approval; the legacy worker's word is a conflict.
    expect(verdict.locator("h2")).to_have_text(
        "Verdict: duplicated audit delivery, control working"
    )
    items = verdict.locator("[data-verdict]")
    expect(items).to_have_count(2)
    expect(items.nth(0)).to_have_attribute("data-verdict", "duplicated_audit_delivery")
    expect(items.nth(0)).to_contain_text(legacy["event_id"])
    expect(items.nth(1)).to_have_attribute("data-verdict", "control_working")
    conflict = verdict.locator("#verdict-conflicts")
    expect(conflict).to_contain_text("An external producer reports a second approved execution")
    expect(conflict).to_contain_text("legacy-log-shipper")
    expect(conflict).to_contain_text("approved for legacy-worker-9")
    expect(page.locator(".chain-table")).to_contain_text("claim.replayed")
    expect(page.locator(".chain-table")).to_contain_text("delivered \u00d72")
    for raw in (token, safe_token):
        assert raw not in page.content()
    _shoot(page, out / "investigation.png")
    page.screenshot(path=str(tmp_path / "investigation-full.png"), full_page=True)

    # The chain leads to the occurrence's timeline.
    page.locator(f'a.occurrence-link[href="/operations/occurrences/{occurrence_id}/"]').click()
    expect(page.locator("#why")).to_be_visible()
    assert safe_occurrence not in page.url
