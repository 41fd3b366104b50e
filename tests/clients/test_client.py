"""The Python client against a live console: every call over real HTTP, refusals as typed
exceptions, retries that honour Retry-After, and a token nothing prints."""

from __future__ import annotations

import logging
import pickle
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from approval_console import (
    ApprovalConsole,
    AsyncApprovalConsole,
    RetryPolicy,
    errors,
    execution_id_for,
    parse_retry_after,
)

from approvals.models import Command, Occurrence, Tenant
from tests.clients.conftest import (
    CASE_ARGS,
    Sleeps,
    approve,
    commands_of,
    expire,
    reject,
    run_async,
)
from tests.conftest import REFUND_ARGS, Runtime, make_runtime

pytestmark = pytest.mark.django_db(transaction=True)


def propose_case(console: ApprovalConsole, ref: str = "call_0", run_id: str = "run-1") -> str:
    proposed = console.propose(
        "close_case", CASE_ARGS, run_id=run_id, reason="Resolved by phone.", client_ref=ref
    )
    return proposed.occurrence_id


def test_propose_wait_pickup_claim_report(console: ApprovalConsole, reviewer: Any, sleeps: Sleeps):
    proposed = console.propose(
        "close_case", CASE_ARGS, run_id="run-1", reason="Resolved.", client_ref="call_0"
    )
    assert proposed.created and proposed.status == "pending_review"
    assert proposed.prior_decisions == []
    again = console.propose(
        "close_case", CASE_ARGS, run_id="run-1", reason="Resolved.", client_ref="call_0"
    )
    assert not again.created and again.occurrence_id == proposed.occurrence_id
    occurrence_id = proposed.occurrence_id

    found = console.lookup("run-1", "call_0")
    assert found is not None and found.occurrence_id == occurrence_id
    assert console.lookup("run-2", "call_0") is None  # another run: nothing, and nothing made

    # The reviewer decides while the client waits between two polls.
    sleeps.then = lambda: approve(occurrence_id, reviewer)
    decided = console.wait(occurrence_id, timeout=60)
    assert decided.status == "approved" and decided.approval is not None
    assert sleeps.waits == [console.poll_interval]

    execution = execution_id_for("run-1", "call_0")
    token = console.pickup(occurrence_id, execution)
    assert token.execution_id == execution and not token.redelivered
    claim = console.claim(token, tool="close_case", arguments=CASE_ARGS, execution_id=execution)
    assert claim.decision == "approved" and claim.executed_by == "runtime"
    assert not claim.duplicate

    detail = console.report_effect(
        claim.command_id, execution_id=execution, outcome="committed", receipt="closed"
    )
    assert detail.effect_state == "committed"
    assert console.command(claim.command_id).effect_state == "committed"

    # A crash after the claim: the same claim again is a redelivery of the same command...
    duplicate = console.claim(token, tool="close_case", arguments=CASE_ARGS, execution_id=execution)
    assert duplicate.duplicate and duplicate.command_id == claim.command_id
    # ...the pickup names the command and the execution that consumed the approval...
    with pytest.raises(errors.AlreadyClaimed) as claimed:
        console.pickup(occurrence_id, execution)
    assert claimed.value.command_id == claim.command_id
    assert claimed.value.execution_id == execution
    # ...and another execution is a replay.
    with pytest.raises(errors.Replayed) as replayed:
        console.claim(token, tool="close_case", arguments=CASE_ARGS, execution_id="other")
    assert replayed.value.reason == "consumed_by_other_execution"
    assert len(commands_of(occurrence_id)) == 1


def test_redelivery_is_bound_to_the_execution(console: ApprovalConsole, reviewer: Any):
    occurrence_id = propose_case(console)
    approve(occurrence_id, reviewer)
    first = console.pickup(occurrence_id, "exec-a")
    # The process that held `first` died before claiming; the same execution asks again.
    second = console.pickup(occurrence_id, "exec-a")
    assert second.redelivered and second.execution_id == "exec-a"
    assert second.fingerprint != first.fingerprint

    with pytest.raises(errors.TokenAlreadyDelivered):
        console.pickup(occurrence_id, "exec-b")
    with pytest.raises(errors.Replayed) as superseded:
        console.claim(first, tool="close_case", arguments=CASE_ARGS, execution_id="exec-a")
    assert superseded.value.reason == "token_redelivered"
    with pytest.raises(errors.Replayed) as other:
        console.claim(second, tool="close_case", arguments=CASE_ARGS, execution_id="exec-b")
    assert other.value.reason == "bound_to_other_execution"

    claim = console.claim(second, tool="close_case", arguments=CASE_ARGS, execution_id="exec-a")
    assert claim.decision == "approved"
    assert Command.objects.filter(occurrence_id=occurrence_id).count() == 1


def test_refusals_are_typed(console: ApprovalConsole, reviewer: Any, live_server: Any):
    with pytest.raises(errors.InvalidRequest) as invalid:
        console.propose("close_case", {"case_id": 7}, run_id="run-1", reason="x")
    assert invalid.value.status == 422 and isinstance(invalid.value.details, list)

    occurrence_id = propose_case(console)
    with pytest.raises(errors.NotApproved) as not_approved:
        console.pickup(occurrence_id, "exec-a")
    assert not_approved.value.retry_after == 5
    with pytest.raises(errors.NotRenewable) as pending:
        console.renew(occurrence_id)
    assert pending.value.code == "pending_review"

    with pytest.raises(errors.ClientRefConflict):
        console.propose(
            "close_case", {"case_id": "case_78"}, run_id="run-1", reason="x", client_ref="call_0"
        )

    reject(occurrence_id, reviewer, "The customer still needs help.")
    with pytest.raises(errors.Rejected) as rejected:
        console.pickup(occurrence_id, "exec-a")
    assert rejected.value.reason == "The customer still needs help."
    assert console.get(occurrence_id).rejection_reason == "The customer still needs help."

    with pytest.raises(errors.UnknownToken) as unknown:
        console.claim(
            "apv_" + "x" * 40, tool="close_case", arguments=CASE_ARGS, execution_id="exec-a"
        )
    assert unknown.value.decision == "unknown_token" and unknown.value.status == 403

    with pytest.raises(errors.NotFound):
        console.get("00000000-0000-0000-0000-000000000000")
    with (
        ApprovalConsole(live_server.url, "rk_not_a_key") as stranger,
        pytest.raises(errors.Unauthenticated),
    ):
        stranger.tools()


def test_an_effect_report_for_a_console_executed_command_has_its_own_type(
    console: ApprovalConsole, reviewer: Any
):
    """``409 executed_by_console`` is no generic Conflict: the runtime learns that the
    console records this command's effect, and that it should wait for it instead."""
    proposed = console.propose("issue_refund", REFUND_ARGS, run_id="run-1", reason="Late.")
    approve(proposed.occurrence_id, reviewer)
    token = console.pickup(proposed.occurrence_id, "exec-a")
    claim = console.claim(token, tool="issue_refund", arguments=REFUND_ARGS, execution_id="exec-a")
    assert claim.executed_by == "console"
    with pytest.raises(errors.ExecutedByConsole) as refused:
        console.report_effect(claim.command_id, execution_id="exec-a", outcome="committed")
    assert refused.value.status == 409 and refused.value.code == "executed_by_console"
    assert isinstance(refused.value, errors.Conflict)
    assert Command.objects.get(pk=claim.command_id).state == Command.State.PENDING


def test_renew_after_expiry(console: ApprovalConsole, reviewer: Any, second_reviewer: Any):
    occurrence_id = propose_case(console)
    approve(occurrence_id, reviewer)
    expire(occurrence_id)
    with pytest.raises(errors.ApprovalExpired):
        console.pickup(occurrence_id, "exec-a")
    renewed = console.renew(occurrence_id)
    assert renewed.status == "pending_review" and renewed.proposal.version == 2
    approve(occurrence_id, second_reviewer)
    token = console.pickup(occurrence_id, "exec-a")
    claim = console.claim(token, tool="close_case", arguments=CASE_ARGS, execution_id="exec-a")
    assert claim.decision == "approved"


def test_contracts_and_canonical_form(console: ApprovalConsole):
    names = {tool.name for tool in console.tools()}
    assert {"close_case", "issue_refund", "send_message", "lookup_order"} <= names
    contract = console.tool("close_case")
    assert contract.replay_safety == "unsafe" and contract.executed_by == "runtime"
    assert contract.arguments_schema["required"] == ["case_id"]
    with pytest.raises(errors.NotFound):
        console.tool("no_such_tool")

    canonical = console.canonicalize("close_case", CASE_ARGS)
    proposed = console.propose("close_case", CASE_ARGS, run_id="run-1", reason="x")
    assert canonical.action_digest == proposed.proposal.action_digest
    with pytest.raises(errors.InvalidRequest):
        console.canonicalize("close_case", {"case_id": "case 77!"})
    assert Occurrence.objects.count() == 1  # canonicalize wrote nothing


def test_429_is_retried_after_retry_after_then_raised(
    live_server: Any, runtime: Runtime, tenant: Tenant, sleeps: Sleeps, settings: Any
):
    # A long window, so that no request of the test falls into the next one.
    settings.API_RATE_WINDOW_SECONDS = 3600
    Tenant.objects.filter(pk=tenant.pk).update(api_rate_limit=2)
    policy = RetryPolicy(max_retries=2, max_delay=3600)
    with ApprovalConsole(live_server.url, runtime.raw_key, sleep=sleeps, retry=policy) as client:
        client.tools()
        client.tools()
        with pytest.raises(errors.RateLimited) as limited:
            client.tools()
    # Two retries, each after the server's Retry-After (the rest of the window), no more.
    retry_after = limited.value.retry_after
    assert retry_after is not None and 0 < retry_after <= 3600
    assert len(sleeps.waits) == 2
    assert all(abs(wait - retry_after) <= 1 for wait in sleeps.waits)


def test_retry_policy_is_bounded():
    policy = RetryPolicy(max_retries=3, backoff=0.5, max_delay=10)
    assert policy.delay(0, None) == 0.5 and policy.delay(2, None) == 2.0
    assert policy.delay(0, 3600) == 10  # a Retry-After above the cap waits the cap
    assert parse_retry_after("7") == 7
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    seconds = parse_retry_after(later)
    assert seconds is not None and 100 < seconds <= 120


def test_the_raw_token_is_never_shown(
    console: ApprovalConsole, reviewer: Any, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG, logger="approval_console")
    occurrence_id = propose_case(console)
    approve(occurrence_id, reviewer)
    token = console.pickup(occurrence_id, "exec-a")
    raw = token.reveal()
    assert raw.startswith("apv_")
    assert raw not in repr(token) and raw not in str(token) and raw not in f"{token}"
    assert token.fingerprint in repr(token)
    with pytest.raises(TypeError):
        pickle.dumps(token)
    with pytest.raises(errors.Replayed) as refused:
        console.claim(token, tool="close_case", arguments=CASE_ARGS, execution_id="exec-b")
    assert raw not in str(refused.value) and raw not in repr(refused.value.details)
    assert raw not in repr(console) and runtime_key_hidden(console)
    assert caplog.records and raw not in caplog.text


def runtime_key_hidden(console: ApprovalConsole) -> bool:
    return "rk_" not in repr(console)


def test_async_client(async_console_factory: Callable[[], AsyncApprovalConsole], reviewer: Any):
    async def propose() -> str:
        async with async_console_factory() as client:
            proposed = await client.propose(
                "close_case", CASE_ARGS, run_id="run-a", reason="x", client_ref="call_0"
            )
            found = await client.lookup("run-a", "call_0")
            assert found is not None and found.occurrence_id == proposed.occurrence_id
            assert (await client.tool("close_case")).replay_safety == "unsafe"
            return proposed.occurrence_id

    occurrence_id = run_async(propose())
    approve(occurrence_id, reviewer)

    async def claim() -> Any:
        async with async_console_factory() as client:
            decided = await client.wait(occurrence_id, timeout=5)
            assert decided.status == "approved"
            token = await client.pickup(occurrence_id, "exec-a")
            return await client.claim(
                token, tool="close_case", arguments=CASE_ARGS, execution_id="exec-a"
            )

    assert run_async(claim()).decision == "approved"
    assert len(commands_of(occurrence_id)) == 1


def test_another_runtime_key_cannot_pick_up(
    console: ApprovalConsole, reviewer: Any, tenant: Tenant, live_server: Any
):
    occurrence_id = propose_case(console)
    approve(occurrence_id, reviewer)
    other = make_runtime(tenant, "other-agent")
    with (
        ApprovalConsole(live_server.url, other.raw_key) as other_console,
        pytest.raises(errors.OtherRuntimeKey),
    ):
        other_console.pickup(occurrence_id, "exec-a")


def test_a_broken_connection_is_retried_only_where_repeating_is_safe(sleeps: Sleeps):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with ApprovalConsole(
        url, "rk_unused", sleep=sleeps, retry=RetryPolicy(max_retries=2)
    ) as client:
        with pytest.raises(errors.TransportError):
            client.get("00000000-0000-0000-0000-000000000000")
        assert len(sleeps.waits) == 2  # a read: retried, bounded
        with pytest.raises(errors.TransportError):
            client.renew("00000000-0000-0000-0000-000000000000")
        assert len(sleeps.waits) == 2  # a renewal is not repeated blindly


def test_long_poll_mode_asks_with_wait(
    live_server: Any, runtime: Runtime, reviewer: Any, sleeps: Sleeps, settings: Any
):
    """A client in long-poll mode reads once, then asks with ``?wait=`` and that answer's
    ETag, and does not sleep between asks (under WSGI, as here, the view waits in its
    thread; tests/clients/test_client_long_poll.py runs 100 waiters under ASGI)."""
    settings.LONG_POLL_FALLBACK_SECONDS = 0.1
    with ApprovalConsole(live_server.url, runtime.raw_key, sleep=sleeps, long_poll=True) as client:
        occurrence_id = propose_case(client)
        seen: list[tuple[str, str | None]] = []
        client._http.event_hooks["request"].append(
            lambda request: seen.append((str(request.url), request.headers.get("If-None-Match")))
        )
        timer = threading.Timer(0.5, approve, args=(occurrence_id, reviewer))
        timer.start()
        try:
            assert client.wait(occurrence_id, timeout=60).status == "approved"
        finally:
            timer.join()
    assert len(seen) == 2, seen
    assert "wait=" not in seen[0][0] and seen[0][1] is None
    assert "wait=" in seen[1][0] and seen[1][1]
    assert sleeps.waits == []
