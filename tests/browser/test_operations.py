"""The operations console in Chromium: an operator takes items from the queue to a recorded
decision, each action through its form; two operators racing on one decision; and the
README's pictures of the queue and a timeline (UPDATE_SCREENSHOTS=1 writes them to docs/).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from approvals.models import Approval, Command, Epoch, Membership
from approvals.reviews.renewal import occurrence_renew
from reconciliation.dispatch import command_dispatch
from reconciliation.models import OperatorDecision
from tests.browser.a11y import active_element
from tests.browser.conftest import Contexts, login
from tests.browser.test_screenshots import _shoot
from tests.conftest import Runtime, approve, make_user
from tests.demo.sandbox_fixture import SandboxProcess, start_sandbox
from tests.reconciliation.conftest import claim_command

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The queue polls every 5 s.
POLL_TIMEOUT_MS = 15_000
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


def unknown(
    runtime: Runtime, reviewer: Any, remote: SandboxProcess, tool: str, ref: str
) -> Command:
    command = claim_command(runtime, reviewer, tool, ref=ref)
    remote.fault("reset_after_effect" if tool == "send_message" else "timeout_after_effect")
    if tool == "issue_refund":
        # A refund stuck sending, as after a worker that died mid-call.
        from reconciliation.dispatch import begin

        begin(command_id=command.pk)
        remote.reset()
    else:
        command_dispatch(command_id=command.pk)
    command.refresh_from_db()
    return command


def decide(page: Page, action: str, note: str, **fields: str) -> None:
    form = page.locator(f"#action-{action}")
    if "outcome" in fields:
        form.locator(f"input[name=outcome][value={fields['outcome']}]").check()
    if "evidence" in fields:
        form.locator("input[name=evidence]").fill(fields["evidence"])
    if "manual_evidence" in fields:
        form.locator("input[name=manual_evidence]").fill(fields["manual_evidence"])
    form.locator("textarea[name=note]").fill(note)
    with page.expect_navigation():
        form.get_by_role("button").click()


def test_an_operator_resolves_an_unknown_message_and_a_refund_from_the_queue(
    contexts: Contexts,
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    operator: Any,
    settings: Any,
    tmp_path: Path,
) -> None:
    out = DOCS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path
    settings.OPERATIONS_STUCK_SECONDS = 0
    message = unknown(runtime, reviewer, remote, "send_message", "m1")
    refund = unknown(runtime, reviewer, remote, "issue_refund", "r1")
    Command.objects.filter(pk=message.pk).update(updated_at=timezone.now() - timedelta(minutes=42))
    page = contexts.new().new_page()
    login(page, operator.username)

    page.goto("/operations/")
    expect(page.locator("#queue-total")).to_have_text("2")
    expect(page.locator(f'tr[data-item="outcome_unknown:{message.pk}"]')).to_contain_text(
        "42 minutes"
    )
    _shoot(page, out / "operations-queue.png")

    # The message: unknown, so reconciled by hand with evidence.
    page.locator(f'tr[data-item="outcome_unknown:{message.pk}"]').get_by_role("link").click()
    expect(page.locator("#why")).to_contain_text("It waits for reconciliation")
    expect(page.locator(".dimension").nth(2)).to_contain_text("Outcome unknown")
    _shoot(page, out / "operations-timeline.png")
    decide(
        page,
        "reconcile",
        "Receiver's log shows it",
        outcome="committed",
        evidence="msg log line 88",
    )
    expect(page.locator(".messages")).to_contain_text("Reconciled as committed")
    expect(page.locator(".dimension").nth(2)).to_contain_text("Reconciled as committed")
    expect(page.locator(".timeline-table")).to_contain_text("operator.reconcile")

    # The refund: stuck sending; the adapter is asked, finds nothing, so a retry is
    # justified; the retry runs; then the refund is compensated through the adapter.
    page.goto(f"/operations/occurrences/{refund.occurrence_id}/")
    decide(page, "query-effect", "Was it sent?")
    expect(page.locator(".messages")).to_contain_text("no effect under this key")
    decide(page, "retry", "Send it now, the query proved nothing happened")
    expect(page.locator(".messages")).to_contain_text("Retry admitted as epoch 2")
    command_dispatch(command_id=refund.pk)
    page.reload()
    expect(page.locator(".dimension").nth(2)).to_contain_text("Committed")
    decide(page, "compensate", "Customer was refunded by the bank meanwhile")
    expect(page.locator(".messages")).to_contain_text("Compensated by the adapter")
    [row] = remote.refunds()
    assert row["status"] == "reversed"
    assert list(
        OperatorDecision.objects.order_by("created_at").values_list("action", "operator")
    ) == [
        ("reconcile", operator.username),
        ("query_effect", operator.username),
        ("retry", operator.username),
        ("compensate", operator.username),
    ]


def test_accepting_the_ambiguity_delivers_again_under_a_new_epoch(
    contexts: Contexts, remote: SandboxProcess, runtime: Runtime, reviewer: Any, operator: Any
) -> None:
    message = unknown(runtime, reviewer, remote, "send_message", "m2")
    page = contexts.new().new_page()
    login(page, operator.username)
    page.goto(f"/operations/occurrences/{message.occurrence_id}/")

    decide(page, "accept-ambiguity", "Customer confirmed nothing arrived; resend")

    expect(page.locator(".messages")).to_contain_text("Ambiguity accepted: epoch 2")
    expect(page.locator("table").first).to_contain_text("Operator accepted the ambiguity")
    epoch = Epoch.objects.get(occurrence_id=message.occurrence_id, number=2)
    assert epoch.justification == "ambiguity_accepted"


def test_a_runtime_executed_command_waits_in_the_queue_after_the_ambiguity_is_accepted(
    contexts: Contexts, runtime: Runtime, reviewer: Any, operator: Any
) -> None:
    case = claim_command(runtime, reviewer, "close_case", ref="c1")
    reported = runtime.post(
        f"/api/v1/commands/{case.pk}/effect",
        {"execution_id": "exec-1", "outcome": "outcome_unknown"},
    )
    assert reported.status_code == 200, reported.content
    page = contexts.new().new_page()
    login(page, operator.username)
    page.goto(f"/operations/occurrences/{case.occurrence_id}/")

    decide(page, "accept-ambiguity", "The CRM cannot tell; close it again")

    expect(page.locator(".messages")).to_contain_text("told to run it again")
    expect(page.locator("#why")).to_contain_text("It waits for the runtime")
    page.goto("/operations/")
    row = page.locator(f'tr[data-item="waiting_for_runtime:{case.pk}"]')
    expect(row).to_contain_text("Waiting for the runtime")
    expect(row).to_contain_text("close_case")
    # The runtime runs it again under the admitted epoch and reports: the queue empties.
    attempt = runtime.get(f"/api/v1/occurrences/{case.occurrence_id}").json()["next_attempt"]
    assert attempt["justification"] == "ambiguity_accepted"
    runtime.post(
        f"/api/v1/commands/{case.pk}/effect",
        {"execution_id": attempt["execution_id"], "outcome": "committed"},
    )
    page.reload()
    expect(row).to_have_count(0)
    expect(page.locator("#queue-total")).to_have_text("0")


def test_two_operators_at_once_one_wins_the_other_sees_what_happened(
    contexts: Contexts,
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    operator: Any,
    tenant: Any,
) -> None:
    message = unknown(runtime, reviewer, remote, "send_message", "m3")
    other = make_user("oona", tenant, Membership.Role.OPERATOR)
    first, second = contexts.new().new_page(), contexts.new().new_page()
    login(first, operator.username)
    login(second, other.username)
    url = f"/operations/occurrences/{message.occurrence_id}/"
    first.goto(url)
    second.goto(url)

    decide(
        first,
        "reconcile",
        "Not sent: the receiver was down",
        outcome="not_committed",
        evidence="status page incident 12",
    )
    decide(second, "accept-ambiguity", "Resend it")

    expect(first.locator(".messages")).to_contain_text("Reconciled as not committed")
    notice = second.locator("#operator-notice")
    expect(notice).to_contain_text("Refused: the effect is now reconciled")
    expect(second.locator(".dimension").nth(2)).to_contain_text("Reconciled as not committed")
    assert OperatorDecision.objects.count() == 1
    assert Epoch.objects.filter(occurrence_id=message.occurrence_id).count() == 1


# --- the queue updates by itself and keeps the keyboard -------------------------------------


def _expired_unclaimed(runtime: Runtime, reviewer: Any, ref: str, minutes_ago: int) -> Approval:
    """An approval that expired unclaimed ``minutes_ago``: an item of the queue."""
    occurrence_id = runtime.propose(client_ref=ref).json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    expired = timezone.now() - timedelta(minutes=minutes_ago)
    Approval.objects.filter(occurrence_id=occurrence_id).update(
        issued_at=expired - timedelta(minutes=15), expires_at=expired
    )
    return Approval.objects.get(occurrence_id=occurrence_id)


def _renew(approval: Approval) -> None:
    occurrence_renew(occurrence=approval.occurrence, actor="runtime:test")


def _queue_link(approval: Approval) -> str:
    return f"queue-link-expired_unclaimed-{approval.pk}"


def test_the_queue_poll_keeps_focus_on_the_open_link_or_its_replacement(
    page: Page, runtime: Runtime, reviewer: Any, operator: Any
) -> None:
    oldest = _expired_unclaimed(runtime, reviewer, "q-a", minutes_ago=30)
    middle = _expired_unclaimed(runtime, reviewer, "q-b", minutes_ago=20)
    login(page, operator.username)
    page.goto("/operations/")
    page.locator(f"#{_queue_link(oldest)}").focus()
    assert active_element(page) == f"a#{_queue_link(oldest)}"

    # A new item arrives with the next poll: the list is swapped, focus stays put.
    newest = _expired_unclaimed(runtime, reviewer, "q-c", minutes_ago=10)
    expect(page.locator(f"#{_queue_link(newest)}")).to_be_visible(timeout=POLL_TIMEOUT_MS)
    assert active_element(page) == f"a#{_queue_link(oldest)}"

    # Its item is dealt with elsewhere (the runtime renews the request: back to review)
    # and leaves: focus goes to the link in its place (oldest first: the next one), not
    # to <body>.
    _renew(oldest)
    expect(page.locator(f"#{_queue_link(oldest)}")).to_have_count(0, timeout=POLL_TIMEOUT_MS)
    assert active_element(page) == f"a#{_queue_link(middle)}"

    # The rest go too: focus lands on the summary, which says there is nothing left.
    for approval in (middle, newest):
        _renew(approval)
    expect(page.locator("#queue-total")).to_have_text("0", timeout=POLL_TIMEOUT_MS)
    assert active_element(page) == "p#queue-summary"
