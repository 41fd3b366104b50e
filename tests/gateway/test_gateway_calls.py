"""Issue 27 §3: the MCP gateway end to end, with real processes: ``manage.py mcp_gateway``
in front of the demo MCP server (``demo.mcp_shop``, which counts the calls it receives),
and a real ``mcp.ClientSession``. Reviewers decide through the console's services."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from approvals.models import AuditEvent, Command, Occurrence, ToolContract
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from approvals.vocabulary import AuditKind
from gateway.models import GatewayCall
from gateway.upstreams import IDEMPOTENCY_META_KEY
from reconciliation.selectors.queue import queue_counts
from tests.conftest import approve
from tests.gateway.clients import Seen, call, call_and_hang_up, text_of
from tests.gateway.conftest import Setup, in_thread, pending_occurrence
from tests.reconciliation.worker_fixture import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REFUND = {"order_id": "ord_1", "amount_minor": 2500, "currency": "EUR"}


def test_tools_are_prefixed_and_contracts_registered_from_annotations(
    gateway_setup: Setup,
) -> None:
    gateway_setup.gateway.start()
    seen = Seen()
    result = in_thread(
        call(gateway_setup.gateway.url, "shop__lookup_order", {"order_id": "o1"}, seen)
    ).result()

    assert sorted(seen.tools) == ["shop__issue_refund", "shop__lookup_order", "shop__send_message"]
    contracts = {c.name: c for c in ToolContract.objects.filter(name__startswith="shop__")}
    assert contracts["shop__lookup_order"].replay_safety == "read_only"
    assert contracts["shop__lookup_order"].auto_admit
    assert contracts["shop__issue_refund"].replay_safety == "idempotent_with_key"
    assert not contracts["shop__issue_refund"].auto_admit
    assert contracts["shop__send_message"].replay_safety == "unsafe"
    registered = AuditEvent.objects.filter(kind=AuditKind.TOOL_CONTRACT_REGISTERED)
    assert sorted(e.data["tool"] for e in registered) == sorted(contracts)

    # The read-only call passed by policy: recorded, no human, one upstream call.
    assert not result.is_error, text_of(result)
    assert "delivered" in text_of(result)
    (occurrence,) = Occurrence.objects.filter(tool__name="shop__lookup_order")
    assert occurrence.status == Occurrence.Status.AUTO_ADMITTED
    assert len(gateway_setup.ledger.calls("lookup_order")) == 1
    assert not GatewayCall.objects.exists()


def test_approved_call_runs_once_with_the_commands_key_and_reports_its_receipt(
    gateway_setup: Setup,
) -> None:
    gateway_setup.gateway.start()
    seen = Seen()
    client = in_thread(call(gateway_setup.gateway.url, "shop__issue_refund", REFUND, seen))
    occurrence = pending_occurrence("shop__issue_refund")
    # The URL-mode elicitation names the review page of exactly this occurrence.
    url = seen.urls.get(timeout=60)
    assert url == f"http://127.0.0.1:8000/reviews/{occurrence.pk}/"
    assert not gateway_setup.ledger.calls(), "nothing runs before the approval"
    journal = GatewayCall.objects.get(occurrence=occurrence)
    assert occurrence.run_id == journal.session_id and occurrence.client_ref == journal.request_id

    assert approve(str(occurrence.pk), gateway_setup.reviewer).issued
    result = client.result()

    assert not result.is_error, text_of(result)
    assert "re_0" in text_of(result)
    (sent,) = gateway_setup.ledger.calls("issue_refund")
    command = Command.objects.get(occurrence=occurrence)
    assert sent["idempotency_key"] == command.idempotency_key
    assert sent["arguments"] == REFUND
    assert command.state == Command.State.COMMITTED
    journal.refresh_from_db()
    assert journal.state == GatewayCall.State.DONE and journal.outcome == "committed"
    assert journal.execution_id == command.execution_id
    effect = AuditEvent.objects.get(kind=AuditKind.EFFECT_COMMITTED, command_id=command.pk)
    assert effect.data["receipt"] == journal.result_digest and len(journal.result_digest) == 64
    assert seen.completed == [str(occurrence.pk)]
    assert IDEMPOTENCY_META_KEY == "approval-console/idempotency-key"


def test_rejection_returns_is_error_with_the_reviewers_reason(gateway_setup: Setup) -> None:
    gateway_setup.gateway.start()
    seen = Seen()
    client = in_thread(
        call(gateway_setup.gateway.url, "shop__send_message", {"to": "ann", "text": "hi"}, seen)
    )
    occurrence = pending_occurrence("shop__send_message")
    occurrence_reject(
        occurrence=occurrence, reviewer=gateway_setup.reviewer, reason="Wrong customer"
    )
    result = client.result()

    assert result.is_error
    assert "Wrong customer." in text_of(result) and ".." not in text_of(result)
    assert not gateway_setup.ledger.calls()
    assert not Command.objects.exists()
    journal = GatewayCall.objects.get(occurrence=occurrence)
    assert journal.state == GatewayCall.State.DONE and journal.outcome == "rejected"


def test_timeout_returns_its_own_error(gateway_setup: Setup) -> None:
    gateway_setup.write_config("[upstreams.shop.tools.send_message]\nfinal_deadline_seconds = 2\n")
    gateway_setup.gateway.start()
    client = in_thread(
        call(gateway_setup.gateway.url, "shop__send_message", {"to": "a", "text": "b"}, Seen())
    )
    occurrence = pending_occurrence("shop__send_message")
    assert occurrence.final_deadline_at is not None
    from approvals.reviews.deadlines import occurrence_time_out

    wait_until("the final deadline", lambda: occurrence_time_out(occurrence.pk), timeout=30)
    result = client.result()

    assert result.is_error
    assert "timed_out" in text_of(result) and "nothing was run" in text_of(result)
    assert not gateway_setup.ledger.calls()


def test_upstream_is_error_is_a_rejected_effect(gateway_setup: Setup) -> None:
    gateway_setup.gateway.start()
    too_much = {**REFUND, "amount_minor": 500_000}
    client = in_thread(call(gateway_setup.gateway.url, "shop__issue_refund", too_much, Seen()))
    occurrence = pending_occurrence("shop__issue_refund")
    approve(str(occurrence.pk), gateway_setup.reviewer)
    result = client.result()

    assert result.is_error and "declined" in text_of(result)
    assert len(gateway_setup.ledger.calls("issue_refund")) == 1
    assert Command.objects.get(occurrence=occurrence).state == Command.State.REJECTED


def test_a_reviewers_edit_runs_and_the_model_is_told(gateway_setup: Setup) -> None:
    gateway_setup.gateway.start()
    client = in_thread(call(gateway_setup.gateway.url, "shop__issue_refund", REFUND, Seen()))
    occurrence = pending_occurrence("shop__issue_refund")
    editor = gateway_setup.reviewer
    from tests.conftest import make_user

    second = make_user("ravi", gateway_setup.tenant, "reviewer")
    proposal_edit(
        occurrence=occurrence,
        editor=editor,
        arguments={**REFUND, "amount_minor": 1000},
        seen_digest=occurrence.proposals.get(is_current=True).action_digest,
    )
    approve(str(occurrence.pk), second)
    result = client.result()

    assert not result.is_error, text_of(result)
    assert '"amount_minor": 1000' in text_of(result)
    (sent,) = gateway_setup.ledger.calls("issue_refund")
    assert sent["arguments"]["amount_minor"] == 1000


def test_without_url_elicitation_the_client_gets_progress_while_it_waits(
    gateway_setup: Setup,
) -> None:
    gateway_setup.gateway.start()
    seen = Seen()
    client = in_thread(
        call(gateway_setup.gateway.url, "shop__issue_refund", REFUND, seen, elicitation=False)
    )
    occurrence = pending_occurrence("shop__issue_refund")
    wait_until("two progress notes", lambda: len(seen.progress) >= 2, timeout=60)
    approve(str(occurrence.pk), gateway_setup.reviewer)
    result = client.result()

    assert not result.is_error
    assert not seen.elicitations
    assert f"/reviews/{occurrence.pk}/" in seen.progress[0]


def test_a_client_that_hangs_up_loses_nothing_and_a_new_call_needs_its_own_approval(
    gateway_setup: Setup,
) -> None:
    gateway = gateway_setup.gateway
    gateway.start()
    seen = Seen()
    in_thread(call_and_hang_up(gateway.url, "shop__issue_refund", REFUND, seen)).result()
    occurrence = pending_occurrence("shop__issue_refund")
    assert not gateway_setup.ledger.calls()

    # Approved after the client left: the call still runs, once, and its effect is recorded.
    approve(str(occurrence.pk), gateway_setup.reviewer)
    journal = GatewayCall.objects.get(occurrence=occurrence)
    wait_until("the call to settle", lambda: _state(journal) == "done", timeout=90)
    assert len(gateway_setup.ledger.calls("issue_refund")) == 1
    assert Command.objects.get(occurrence=occurrence).state == Command.State.COMMITTED

    # The client reconnects and asks again: a new session, a new request, waiting for its
    # own approval; the first approval ran its one call and authorizes nothing more.
    again = in_thread(call(gateway.url, "shop__issue_refund", REFUND, Seen()))
    wait_until(
        "a second proposal",
        lambda: Occurrence.objects.filter(tool__name="shop__issue_refund").count() == 2,
    )
    second = Occurrence.objects.exclude(pk=occurrence.pk).get(tool__name="shop__issue_refund")
    assert second.status == Occurrence.Status.PENDING_REVIEW
    assert len(gateway_setup.ledger.calls("issue_refund")) == 1
    occurrence_reject(occurrence=second, reviewer=gateway_setup.reviewer, reason="Done already")
    assert again.result().is_error
    assert len(gateway_setup.ledger.calls("issue_refund")) == 1


@pytest.mark.parametrize("point", ["before_claim", "after_claim"])
def test_gateway_killed_between_approval_and_upstream_call_runs_it_once_after_restart(
    gateway_setup: Setup, tmp_path: object, point: str
) -> None:
    crash_dir = str(gateway_setup.ledger.path.parent)
    gateway = gateway_setup.gateway
    gateway.start(GATEWAY_CRASH_AT=point, GATEWAY_CRASH_DIR=crash_dir)
    client = in_thread(call(gateway.url, "shop__issue_refund", REFUND, Seen()))
    occurrence = pending_occurrence("shop__issue_refund")
    approve(str(occurrence.pk), gateway_setup.reviewer)
    assert gateway.wait_dead() == -9, gateway.output()
    with pytest.raises(BaseException):  # noqa: B017, the client's connection is gone
        client.result()
    assert not gateway_setup.ledger.calls()

    gateway.start()  # no crash point: the restarted gateway resumes its journal
    journal = GatewayCall.objects.get(occurrence=occurrence)
    wait_until("the resumed call to settle", lambda: _state(journal) == "done", timeout=90)

    (sent,) = gateway_setup.ledger.calls("issue_refund")
    command = Command.objects.get(occurrence=occurrence)
    assert command.state == Command.State.COMMITTED
    assert sent["idempotency_key"] == command.idempotency_key
    assert command.execution_id == journal.execution_id
    # The token was picked up and claimed in one transaction, once, by the journal's
    # execution: the killed process left neither a token nor a claim behind.
    assert AuditEvent.objects.filter(kind=AuditKind.TOKEN_DELIVERED).count() == 1
    assert AuditEvent.objects.filter(kind=AuditKind.CLAIM_APPROVED).count() == 1
    # A third start finds nothing to do: still one call.
    gateway.stop()
    gateway.start()
    time.sleep(1)
    assert len(gateway_setup.ledger.calls("issue_refund")) == 1


def test_gateway_killed_after_the_upstream_call_reports_outcome_unknown_never_calls_again(
    gateway_setup: Setup,
) -> None:
    crash_dir = str(gateway_setup.ledger.path.parent)
    gateway = gateway_setup.gateway
    gateway.start(GATEWAY_CRASH_AT="after_call", GATEWAY_CRASH_DIR=crash_dir)
    client = in_thread(call(gateway.url, "shop__send_message", {"to": "ann", "text": "hi"}, Seen()))
    occurrence = pending_occurrence("shop__send_message")
    approve(str(occurrence.pk), gateway_setup.reviewer)
    assert gateway.wait_dead() == -9, gateway.output()
    with pytest.raises(BaseException):  # noqa: B017
        client.result()
    assert len(gateway_setup.ledger.calls()) == 1
    command = Command.objects.get(occurrence=occurrence)
    assert command.state == Command.State.PENDING

    gateway.start()
    journal = GatewayCall.objects.get(occurrence=occurrence)
    wait_until("the journal to settle", lambda: _state(journal) == "done", timeout=90)

    command.refresh_from_db()
    assert command.state == Command.State.OUTCOME_UNKNOWN
    journal.refresh_from_db()
    assert journal.outcome == "outcome_unknown"
    assert len(gateway_setup.ledger.calls()) == 1
    # The operators' queue lists it: an unknown outcome, for a person to resolve.
    counts = queue_counts(tenant_ids=[gateway_setup.tenant.pk], now=timezone.now())
    assert counts["outcome_unknown"] == 1, counts

    gateway.stop()
    gateway.start()
    time.sleep(1)
    assert len(gateway_setup.ledger.calls()) == 1


def _state(journal: GatewayCall) -> str:
    journal.refresh_from_db()
    return journal.state
