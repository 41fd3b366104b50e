"""Every page and state of the console through axe-core (any violation fails, listed page
by page), with exactly one polite live region, and without sideways scrolling at 200% zoom
(a 640 px wide viewport: 1280 px at 200%)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from approvals.access import reviewer_tokens
from approvals.audit.record import audit_record
from approvals.models import Approval, Membership, Occurrence, Tenant
from approvals.reviews.decisions import occurrence_reject
from approvals.reviews.revocation import approval_revoke
from tests.browser.a11y import (
    AxeReport,
    assert_one_polite_live_region,
    live_regions,
    sideways_overflow,
)
from tests.browser.conftest import Contexts, login, open_review, propose
from tests.conftest import REFUND_ARGS, Runtime, approve, make_runtime

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ZOOMED_WIDTH = 640
# The inbox and the queue poll every 5 s.
POLL_TIMEOUT_MS = 15_000
MESSAGE = {"to": "dana@example.com", "subject": "Your refund", "body": "It is on its way."}


@dataclass
class Occurrences:
    pending: str
    awaiting_quorum: str
    issued: str
    delivered: str
    consumed: str
    rejected: str
    revoked: str
    expired: str


def _every_state(runtime: Runtime, reviewer: Any, admin: Any) -> Occurrences:
    """One occurrence in each state the review page shows."""
    pending = propose(runtime, "send_message", arguments=MESSAGE, run_id="run-pending")
    issued, delivered, consumed, rejected, revoked, expired = (
        propose(runtime, client_ref=f"ref-{n}") for n in range(6)
    )
    for occurrence_id in (issued, delivered, consumed, revoked, expired):
        assert approve(occurrence_id, reviewer).issued
    # Above EUR 500.00 two reviewers must approve: one has.
    awaiting = propose(runtime, arguments={**REFUND_ARGS, "amount_minor": 60_000})
    assert not approve(awaiting, reviewer).issued
    assert runtime.token(delivered).status_code == 200
    token = runtime.token(consumed).json()["token"]
    assert runtime.claim(token, "exec-a").json()["decision"] == "approved"
    assert runtime.claim(token, "exec-a").json()["decision"] == "duplicate_delivery"
    assert runtime.claim(token, "exec-b").status_code == 403  # a replay, refused
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=rejected), reviewer=reviewer, reason="Not this one"
    )
    assert approval_revoke(
        approval=Approval.objects.get(occurrence_id=revoked), admin=admin, reason="Wrong account"
    )
    Approval.objects.filter(occurrence_id=expired).update(
        issued_at=timezone.now() - timedelta(hours=2),
        expires_at=timezone.now() - timedelta(hours=1),
    )
    return Occurrences(pending, awaiting, issued, delivered, consumed, rejected, revoked, expired)


class Walk:
    """Visits each page in two contexts, at 1280 px and at 640 px (200% zoom): axe-core on
    both, the live regions at 1280, sideways scrolling at 640."""

    def __init__(self, contexts: Contexts) -> None:
        self.wide = contexts.new(bypass_csp=True).new_page()
        self.narrow = contexts.new(width=ZOOMED_WIDTH, bypass_csp=True).new_page()
        self.axe = AxeReport()
        self.overflowing: dict[str, int] = {}
        self.regions: dict[str, list[str]] = {}

    def login(self, username: str) -> None:
        for page in (self.wide, self.narrow):
            page.context.clear_cookies()
            login(page, username)

    def visit(self, name: str, url: str, status: int = 200, *, live: int = 1) -> None:
        for page in (self.wide, self.narrow):
            response = page.goto(url)
            assert response is not None and response.status == status, (name, url)
        self.check(name, live=live)

    def check(self, name: str, *, live: int = 1) -> None:
        self.axe.check(self.wide, name)
        self.axe.check(self.narrow, f"{name} at {ZOOMED_WIDTH} px")
        regions = live_regions(self.wide)
        if len(regions) != live:
            self.regions[name] = regions
        overflow = sideways_overflow(self.narrow)
        if overflow > 0:
            self.overflowing[name] = overflow

    def assert_clean(self) -> None:
        assert self.regions == {}, "pages with other than one live region"
        assert self.overflowing == {}, f"pages that scroll sideways at {ZOOMED_WIDTH} px"
        self.axe.assert_clean()


def test_the_reviewer_pages_in_every_state(
    contexts: Contexts,
    runtime: Runtime,
    reviewer: Any,
    admin_user: Any,
    other_tenant: Tenant,
) -> None:
    # Two tenants (so the inbox has a tenant column), long names and a look-alike flag:
    # the widest inbox, which once scrolled sideways by 53 px at 640 px.
    Membership.objects.create(user=reviewer, tenant=other_tenant, role=Membership.Role.REVIEWER)
    propose(
        make_runtime(other_tenant, "other-agent"),
        arguments={**REFUND_ARGS, "amount_minor": 123456789, "reason": "P\u0430rcel lost"},
        requested_by="alexandra.konstantinopoulou@example.com",
        run_id="run-2f9c1e7a-5b44-4d8e-9a1b-33cc0a9d7e10",
    )
    walk = Walk(contexts)
    for page in (walk.wide, walk.narrow):
        page.goto("/accounts/login/")
    walk.check("login")
    for page in (walk.wide, walk.narrow):
        page.locator("input[name=username]").fill(reviewer.username)
        page.locator("input[name=password]").fill("not the password")
        with page.expect_navigation():
            page.locator("form [type=submit]").first.click()
        expect(page.locator("#signin-errors")).to_be_visible()
    # The sign-in error is an alert that comes with the page, besides the polite region.
    walk.check("login, wrong password", live=2)

    walk.login(reviewer.username)
    walk.visit("inbox, empty", "/reviews/")
    states = _every_state(runtime, reviewer, admin_user)
    walk.visit("inbox, pending requests", "/reviews/")
    walk.visit("inbox, all states", "/reviews/?state=all")
    walk.visit(
        "bulk review, requests of two tools",
        f"/reviews/bulk/?ids={states.awaiting_quorum}&ids={states.pending}",
    )
    for state in (
        "pending",
        "awaiting_quorum",
        "issued",
        "delivered",
        "consumed",
        "rejected",
        "revoked",
        "expired",
    ):
        occurrence_id = getattr(states, state)
        walk.visit(f"review, {state}", f"/reviews/{occurrence_id}/")
        expect(walk.wide.locator("#decision-panel")).to_have_attribute("data-state", state)
    expect(walk.wide.locator("#evidence-summary")).to_have_count(0)
    walk.visit("review, consumed, with a refused replay", f"/reviews/{states.consumed}/")
    expect(walk.wide.locator("#evidence-summary")).to_contain_text("1 replay refused")
    # A history longer than one window: its pager, on the newest window and an earlier one.
    consumed = Occurrence.objects.get(pk=states.consumed)
    for n in range(120):
        audit_record(
            kind="test.note", tenant=consumed.tenant_id, occurrence=consumed, data={"n": n}
        )
    walk.visit("review, long history", f"/reviews/{states.consumed}/")
    earlier = walk.wide.locator("#history-earlier").get_attribute("href")
    assert earlier is not None and "before=" in earlier
    walk.visit("review, long history, earlier events", earlier)
    expect(walk.wide.locator("#history-later")).to_be_visible()
    # A requester that reads as the admin's name (a Cyrillic a, an invisible space): the
    # look-alike warning inside "Requested by".
    look_alike = propose(runtime, requested_by="\u0430da\u200b", client_ref="look-alike")
    walk.visit("review, a look-alike requester", f"/reviews/{look_alike}/")
    expect(walk.wide.locator("#requester-look-alike")).to_contain_text("console user ada")
    walk.visit("not found", "/reviews/no-such-page/", 404)
    walk.visit("not allowed", "/operations/", 403)
    reviewer_tokens.reviewer_token_issue(
        user=reviewer, tenant=runtime.key.tenant, name="nightly-tests", lifetime_days=30
    )
    walk.visit("access tokens", "/account/tokens/")
    for n, page in enumerate((walk.wide, walk.narrow)):
        page.locator("#token-tenant").select_option(runtime.key.tenant.slug)
        page.locator("#token-name").fill(f"ci-{n}")
        with page.expect_navigation():
            page.locator("#token-create-form [type=submit]").click()
        expect(page.locator("#new-token")).to_be_visible()
    walk.check("access tokens, one just created")

    walk.login(admin_user.username)
    walk.visit("review, issued, as an admin (revoke form)", f"/reviews/{states.issued}/")
    walk.visit("admin: revocations", "/manage/revocations/")
    walk.visit("admin: runtime keys", "/manage/keys/")
    walk.visit("admin: review health", "/manage/review-health/")
    walk.assert_clean()


def test_the_operator_and_admin_pages(
    contexts: Contexts, runtime: Runtime, reviewer: Any, operator: Any, admin_user: Any
) -> None:
    states = _every_state(runtime, reviewer, admin_user)
    walk = Walk(contexts)
    walk.login(operator.username)
    walk.visit("operations: queue", "/operations/")
    walk.visit("operations: timeline", f"/operations/occurrences/{states.consumed}/")
    walk.visit("operations: timeline, not yet claimed", f"/operations/occurrences/{states.issued}/")
    walk.visit("investigate", "/investigations/")
    walk.visit("investigate: an execution", "/investigations/?q=exec-a")
    walk.visit("investigate: nothing found", "/investigations/?q=nothing-like-it")

    walk.login(admin_user.username)
    walk.visit("admin: adapter credentials", "/manage/credentials/")
    walk.visit(
        "admin: revocations, filtered", "/manage/revocations/?tool=issue_refund&state=issued"
    )
    for page in (walk.wide, walk.narrow):
        page.goto("/manage/keys/")
        page.locator("#key-name").fill(f"axe-key-{page.viewport_size['width']}")  # type: ignore[index]
        with page.expect_navigation():
            page.locator("#key-create-form [type=submit]").click()
        expect(page.locator("#new-key")).to_be_visible()
    walk.check("admin: runtime key created")
    walk.assert_clean()


def test_the_live_region_is_the_only_one_on_a_page_with_a_message(
    contexts: Contexts, runtime: Runtime, reviewer: Any
) -> None:
    """A message that comes with a page (after a redirect) is said in the live region once
    the page has loaded; it is not a live region of its own."""
    occurrence_id = propose(runtime)
    page = contexts.new().new_page()
    login(page, reviewer.username)
    page.goto(f"/reviews/{occurrence_id}/")
    page.locator("#edit-section summary").click()
    page.locator("#edit-arguments").fill(
        '{"payment_id": "pay_123", "amount_minor": 7000, '
        '"currency": "EUR", "reason": "Damaged parcel"}'
    )
    with page.expect_navigation():
        page.locator("#edit-form [type=submit]").click()
    expect(page.locator("#decision-message")).to_contain_text("Saved as version 2")
    assert_one_polite_live_region(page)
    expect(page.locator("#live-announcer")).to_contain_text("Saved as version 2")


def test_error_pages_revocation_and_what_polls_and_clicks_swap_in(
    contexts: Contexts,
    runtime: Runtime,
    reviewer: Any,
    operator: Any,
    admin_user: Any,
    settings: Any,
) -> None:
    """The pages a walk by URL does not reach: the error pages (500, 503, the CSRF 403,
    the sign-in lockout), the revocation preview and its result, and the parts htmx swaps
    in after a click (a decision) or a poll (the inbox, the queue)."""
    settings.ROOT_URLCONF = "tests.error_urls"
    walk = Walk(contexts)
    walk.login(reviewer.username)
    walk.visit("server error", "/reviews/broken/", 500)
    # Rendered without the request's context (the database is gone): no live region.
    walk.visit("database unavailable", "/reviews/unavailable/", 503, live=0)
    for page in (walk.wide, walk.narrow):
        page.goto("/reviews/")
        page.context.clear_cookies(name="csrftoken")
        with page.expect_navigation():
            page.locator(".signout [type=submit]").click()
        expect(page.get_by_role("heading", name="This form has expired")).to_be_visible()
    walk.check("form expired (CSRF)")

    # A decision swaps the panel in: approved, then rejected with a reason.
    walk.login(reviewer.username)
    for page in (walk.wide, walk.narrow):
        open_review(page, propose(runtime))
        page.locator("#approve-button").click()
        expect(page.locator("#decision-panel")).to_have_attribute("data-state", "issued")
    walk.check("review, approved just now (swapped in)")
    for page in (walk.wide, walk.narrow):
        open_review(page, propose(runtime))
        page.locator("#reject-reason").fill("Not for this customer")
        page.locator("#reject-button").click()
        expect(page.locator("#decision-panel")).to_have_attribute("data-state", "rejected")
    walk.check("review, rejected just now (swapped in)")
    # The inbox's poll swaps its list in.
    for page in (walk.wide, walk.narrow):
        page.goto("/reviews/")
    arrived = propose(runtime, client_ref="arrives-while-open")
    for page in (walk.wide, walk.narrow):
        expect(page.locator(f"#review-link-{arrived}")).to_be_visible(timeout=POLL_TIMEOUT_MS)
    walk.check("inbox, refreshed by its poll")

    # The queue's poll swaps its list in too.
    walk.login(operator.username)
    for page in (walk.wide, walk.narrow):
        page.goto("/operations/")
    expired = propose(runtime, client_ref="expires-while-open")
    assert approve(expired, reviewer).issued
    Approval.objects.filter(occurrence_id=expired).update(
        issued_at=timezone.now() - timedelta(hours=2),
        expires_at=timezone.now() - timedelta(hours=1),
    )
    for page in (walk.wide, walk.narrow):
        expect(page.locator("#queue-total")).to_have_text("1", timeout=POLL_TIMEOUT_MS)
    walk.check("operations queue, refreshed by its poll")

    # The revocation preview, and its result (the second confirmation finds the same
    # approvals revoked already: the result that lists what was not revoked, and why).
    for n in range(2):
        assert approve(propose(runtime, client_ref=f"to-revoke-{n}"), reviewer).issued
    walk.login(admin_user.username)
    for page in (walk.wide, walk.narrow):
        page.goto("/manage/revocations/")
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#confirm-button")).to_be_visible()
    walk.check("admin: revocation preview")
    for page in (walk.wide, walk.narrow):
        page.locator("#confirm-reason").fill("Agent run compromised")
        with page.expect_navigation():
            page.locator("#confirm-button").click()
        expect(page.locator("#result-summary")).to_be_visible()
    walk.check("admin: revocation result")

    # Five wrong passwords pause signing in: the lockout page, with its alert.
    for page in (walk.wide, walk.narrow):
        page.context.clear_cookies()
        for _ in range(settings.AXES_FAILURE_LIMIT):
            page.goto("/accounts/login/")
            page.locator("input[name=username]").fill("mallory")
            page.locator("input[name=password]").fill("guess")
            with page.expect_navigation():
                page.locator("form [type=submit]").first.click()
        expect(page.get_by_role("heading", name="Sign-in paused")).to_be_visible()
    walk.check("sign-in paused (lockout)", live=2)
    walk.assert_clean()
