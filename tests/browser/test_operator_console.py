"""The operators' console, second pass (issue 25), in Chromium: only the decisions the state
allows are offered, a refused decision comes back as a redirect to the timeline that says
why (and a reload re-sends nothing), the queue says what each item is, the timeline reads
before it acts, verdicts are named, and ids lead somewhere. axe-core checks each state."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from approvals.models import Approval, Command
from reconciliation.dispatch import command_dispatch
from reconciliation.models import OperatorDecision
from reconciliation.operator_actions import command_reconcile
from tests.browser.a11y import axe_violations
from tests.browser.conftest import Contexts, login
from tests.browser.test_screenshots import _shoot
from tests.conftest import REFUND_ARGS, Runtime, approve
from tests.demo.sandbox_fixture import SandboxProcess, start_sandbox
from tests.reconciliation.conftest import claim_command

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

State = Command.State


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    with start_sandbox(tmp_path_factory.mktemp("sandbox")) as process:
        yield process


@pytest.fixture
def remote(sandbox: SandboxProcess, settings: Any) -> SandboxProcess:
    sandbox.reset()
    settings.PAYMENTS_URL = sandbox.url
    settings.PAYMENTS_API_KEY = sandbox.api_key
    settings.MESSAGES_WEBHOOK_URL = f"{sandbox.url}/v1/messages"
    settings.MESSAGES_WEBHOOK_SECRET = sandbox.webhook_secret
    settings.ADAPTER_READ_TIMEOUT = 1.0
    return sandbox


def unknown_message(runtime: Runtime, reviewer: Any, remote: SandboxProcess, ref: str) -> Command:
    command = claim_command(runtime, reviewer, "send_message", ref=ref)
    remote.fault("reset_after_effect")
    command_dispatch(command_id=command.pk)
    command.refresh_from_db()
    assert command.state == State.OUTCOME_UNKNOWN
    return command


def expired(
    runtime: Runtime, reviewer: Any, payment: str, minutes_ago: int, *, amount: int, run: str
) -> Approval:
    arguments = {**REFUND_ARGS, "payment_id": payment, "amount_minor": amount}
    occurrence_id = runtime.propose(arguments=arguments, run_id=run).json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    at = timezone.now() - timedelta(minutes=minutes_ago)
    Approval.objects.filter(occurrence_id=occurrence_id).update(
        issued_at=at - timedelta(minutes=15), expires_at=at
    )
    return Approval.objects.get(occurrence_id=occurrence_id)


def test_a_refused_decision_redirects_to_the_timeline_and_retry_is_not_offered(
    contexts: Contexts,
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    operator: Any,
    tmp_path: Path,
) -> None:
    command = unknown_message(runtime, reviewer, remote, "prg-1")
    timeline = f"/operations/occurrences/{command.occurrence_id}/"
    page = contexts.new(bypass_csp=True).new_page()
    login(page, operator.username)
    page.goto(timeline)
    expect(page.locator("form.action")).to_have_count(2)  # reconcile, accept ambiguity
    expect(page.locator("#action-retry")).to_have_count(0)

    # Another operator reconciles it as committed while this page is open.
    command_reconcile(
        command_id=command.pk,
        operator="oona",
        note="the receiver's log has it",
        outcome=OperatorDecision.Finding.COMMITTED,
        evidence="log 88",
    )
    form = page.locator("#action-accept-ambiguity")
    form.locator("textarea[name=note]").fill("resend it")
    with page.expect_navigation():
        form.get_by_role("button").click()

    # Post/redirect/get: the address is the timeline's, the refusal is said there.
    assert page.url.endswith(timeline)
    expect(page.locator("#operator-notice")).to_contain_text(
        "Refused: the effect is now reconciled"
    )
    expect(page.locator("#action-retry")).to_have_count(0)
    expect(page.locator("#actions-withheld")).to_contain_text("a retry would duplicate it")
    expect(page.locator("#action-compensate textarea")).to_be_editable()
    assert axe_violations(page) == []
    _shoot(page, tmp_path / "timeline-refused.png")

    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.reload()
    expect(page.locator("#operator-notice")).to_have_count(0)
    assert posts == [], "a reload never re-sends the decision"

    # Read, then act: the decisions sit beside the evidence, and stay in view.
    evidence = page.locator(".dimensions").bounding_box()
    actions = page.locator(".timeline-actions").bounding_box()
    assert evidence and actions and actions["x"] > evidence["x"] + evidence["width"] - 1
    page.mouse.wheel(0, 1500)
    page.wait_for_timeout(200)
    stuck = page.locator(".timeline-actions").bounding_box()
    assert stuck and 0 <= stuck["y"] < 100, stuck
    page.mouse.wheel(0, -3000)
    _shoot(page, tmp_path / "timeline-beside.png")
    assert list(OperatorDecision.objects.values_list("operator", flat=True)) == ["oona"]


def test_the_queue_says_what_an_item_is_sorts_and_finds_it_by_id(
    contexts: Contexts, runtime: Runtime, reviewer: Any, operator: Any, tmp_path: Path
) -> None:
    first = expired(runtime, reviewer, "pay_Zt91kPq", 30, amount=1000, run="run-billing-77")
    second = expired(runtime, reviewer, "pay_Aa12", 20, amount=9000, run="run-support-9")
    # A reader in Berlin: the absolute time is shown in their zone, UTC on hover.
    context = contexts.browser.new_context(
        base_url=contexts.base_url,
        bypass_csp=True,
        timezone_id="Europe/Berlin",
        viewport={"width": 1280, "height": 900},
    )
    contexts.opened.append(context)
    page = context.new_page()
    login(page, operator.username)
    page.goto("/operations/")

    row = page.locator(f'tr[data-item="expired_unclaimed:{first.pk}"]')
    expect(row).to_contain_text("payment_id pay_Zt91kPq")
    expect(row).to_contain_text("run-billing-77")
    local = row.locator("time.local-time")
    expect(local).to_have_attribute("title", re.compile(r"UTC$"))
    expect(local).to_contain_text(re.compile(r"GMT\+1|CET"))  # in the browser's zone
    assert axe_violations(page) == []
    _shoot(page, tmp_path / "queue.png")

    # Sorted by amount, largest first, by clicking the column's header twice.
    page.get_by_role("link", name="Amount").click()
    page.get_by_role("link", name="Amount").click()
    expect(page.locator("th[aria-sort=descending]")).to_contain_text("Amount")
    keys = page.locator("tr[data-item]").evaluate_all("rows => rows.map(r => r.dataset.item)")
    assert keys == [f"expired_unclaimed:{second.pk}", f"expired_unclaimed:{first.pk}"]

    page.locator("#filter-q").fill("pay_Zt91kPq")
    page.locator("#filter-q").press("Enter")
    expect(page.locator("tr[data-item]")).to_have_count(1)
    expect(page.locator("#queue-total")).to_have_text("1")
    assert axe_violations(page) == []


def test_a_normal_flow_is_named_and_says_there_is_nothing_to_do(
    contexts: Contexts,
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    operator: Any,
    tmp_path: Path,
) -> None:
    command = claim_command(runtime, reviewer, ref="normal-1")
    command_dispatch(command_id=command.pk)
    page = contexts.new(bypass_csp=True).new_page()
    login(page, operator.username)
    page.goto("/investigations/")

    page.locator("#q").fill(str(command.pk))
    with page.expect_navigation():
        page.locator("#investigate-form").get_by_role("button", name="Investigate").click()

    expect(page.locator("#verdict-h")).to_have_text(
        "Verdict: Normal: 1 approval → 1 command → 1 effect, committed"
    )
    expect(page.locator("#verdict")).to_contain_text("Nothing to do unless the effect")
    assert axe_violations(page) == []
    _shoot(page, tmp_path / "investigation-normal.png")


def test_ids_are_links_with_copy_buttons_and_every_page_links_investigate(
    contexts: Contexts,
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    operator: Any,
    tmp_path: Path,
) -> None:
    command = claim_command(runtime, reviewer, ref="links-1")
    command_dispatch(command_id=command.pk)
    page = contexts.new(bypass_csp=True).new_page()
    login(page, operator.username)
    page.goto(f"/operations/occurrences/{command.occurrence_id}/")

    page.locator("#fact-receipt ~ button").click()
    expect(page.locator("#fact-receipt ~ .copy-status")).to_have_text(re.compile("Copied|Selected"))
    assert axe_violations(page) == []
    _shoot(page, tmp_path / "timeline-ids.png")

    with page.expect_navigation():
        page.locator("#fact-command a").click()
    expect(page.locator("#verdict-h")).to_contain_text("Normal")

    page.goto(f"/operations/occurrences/{command.occurrence_id}/")
    with page.expect_navigation():
        page.locator("#investigate-link").click()
    expect(page.locator("#q")).to_have_value(str(command.occurrence_id))
