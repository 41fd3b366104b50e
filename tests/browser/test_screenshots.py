"""The README's and docs' pictures, taken from one real flow: inbox, pending, issued, consumed.

Run with UPDATE_SCREENSHOTS=1 to write them to docs/; otherwise they go to a temporary
directory, so that running the suite never changes the working tree:

    UPDATE_SCREENSHOTS=1 SKIP_LINT=1 bin/test tests/browser/test_screenshots.py
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Occurrence
from approvals.reviews.decisions import occurrence_reject
from reconciliation.dispatch import command_dispatch
from tests.browser.conftest import VIEWPORT, login, open_review, panel, propose, wait_for_state
from tests.conftest import Runtime, approve
from tests.demo.sandbox_fixture import SandboxProcess, start_sandbox

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

DOCS = Path(__file__).resolve().parents[2] / "docs"

REFUND_1042 = {
    "payment_id": "pay_8Hq2LmX",
    "amount_minor": 8000,
    "currency": "EUR",
    "reason": "Order 1042 arrived damaged",
}


def _seed_inbox(runtime: Runtime, reviewer: Any) -> str:
    """A morning's worth of requests; returns the refund the pictures follow."""
    claimed = propose(
        runtime,
        arguments={
            "payment_id": "pay_3Fz0QaW",
            "amount_minor": 2450,
            "currency": "EUR",
            "reason": "Late delivery voucher",
        },
        run_id="run-support-0998",
        reason="Delivery was five days late; the policy grants a 10% refund.",
    )
    approve(claimed, reviewer)
    token = runtime.token(claimed).json()["token"]
    claim = runtime.claim(
        token,
        "exec-support-0998-1",
        arguments={
            "payment_id": "pay_3Fz0QaW",
            "amount_minor": 2450,
            "currency": "EUR",
            "reason": "Late delivery voucher",
        },
    )
    assert claim.status_code == 200, claim.content

    rejected = propose(
        runtime,
        arguments={
            "payment_id": "pay_L0r3mIp",
            "amount_minor": 4999,
            "currency": "GBP",
            "reason": "Customer changed their mind",
        },
        run_id="run-support-1017",
        reason="The customer asked to cancel after the item shipped.",
    )
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=rejected),
        reviewer=reviewer,
        reason="Outside the 14-day return window.",
    )

    propose(
        runtime,
        "send_message",
        arguments={
            "to": "dana@example.com",
            "subject": "Your refund is on its way",
            "body": (
                "Hi Dana,\n\nWe refunded EUR 80.00 to your card. It takes 3-5 days to appear.\n"
            ),
        },
        run_id="run-support-1042",
        reason="Tell the customer about the refund.",
    )
    propose(
        runtime,
        arguments={
            "payment_id": "pay_Zt91kPq",
            "amount_minor": 129900,
            "currency": "USD",
            "reason": "Duplicate charge on annual plan",
        },
        run_id="run-billing-77",
        reason="The annual plan was charged twice on the same day.",
        requested_by="billing-agent",
    )
    return propose(
        runtime,
        arguments=REFUND_1042,
        run_id="run-support-1042",
        reason="Customer sent photos of the damaged parcel; policy allows a full refund.",
    )


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def _shoot(page: Page, path: Path) -> None:
    page.mouse.move(0, 0)  # no hover styles in the picture
    # data-state changes on swap, but htmx settles the new classes (the panel's colours)
    # a moment later: wait for that, and for CSS transitions, so a picture never mixes
    # two states.
    page.wait_for_function(
        "() => !document.querySelector('.htmx-request, .htmx-swapping, .htmx-settling')"
    )
    page.wait_for_timeout(400)
    page.screenshot(path=str(path), animations="disabled", caret="hide")
    assert _png_size(path) == (VIEWPORT["width"], VIEWPORT["height"])


@pytest.fixture
def remote(tmp_path: Path, settings: Any) -> Iterator[SandboxProcess]:
    """The sandbox payments API, so that the last picture shows the refund executed."""
    with start_sandbox(tmp_path / "sandbox") as sandbox:
        settings.PAYMENTS_URL = sandbox.url
        settings.PAYMENTS_API_KEY = sandbox.api_key
        yield sandbox


def test_screenshots_of_one_review_flow(
    page: Page, runtime: Runtime, reviewer: Any, tmp_path: Path, remote: SandboxProcess
) -> None:
    out = DOCS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path
    refund = _seed_inbox(runtime, reviewer)

    login(page, reviewer.username)
    page.goto("/reviews/")
    expect(page.locator(f'tr[data-occurrence-id="{refund}"]')).to_be_visible()
    _shoot(page, out / "inbox.png")

    open_review(page, refund)
    wait_for_state(page, "pending")
    _shoot(page, out / "review-pending.png")

    page.locator("#approve-form").get_by_role("button", name="Approve").click()
    wait_for_state(page, "issued")
    _shoot(page, out / "review-issued.png")

    token = runtime.token(refund).json()["token"]
    claim = runtime.claim(token, "exec-support-1042-1", arguments=REFUND_1042)
    assert claim.status_code == 200, claim.content
    wait_for_state(page, "consumed")
    expect(panel(page)).to_contain_text(claim.json()["command_id"])
    # What a worker does next: deliver the command to the payments API, once.
    command_dispatch(command_id=claim.json()["command_id"])
    expect(panel(page)).to_contain_text("Committed: the remote did it.")
    [executed] = remote.refunds()
    expect(panel(page)).to_contain_text(executed["id"])
    _shoot(page, out / "review-consumed.png")
