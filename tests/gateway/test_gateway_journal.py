"""Issue 27 §3: the journal's steps in-process (``gateway.console``), each with the console's
change it goes with: what a restarted gateway finds, and that a step taken twice changes
nothing. The processes and crashes are in test_gateway_calls.py."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import types

from approvals.models import AuditEvent, Command, Tenant
from approvals.vocabulary import AuditKind, ReportedOutcome
from gateway import console
from gateway.config import parse_config
from gateway.contracts import GatewayTool, gateway_tool
from gateway.models import GatewayCall
from reconciliation.effects import command_report_effect
from tests.conftest import Runtime, approve

ARGS = {"to": "ann", "text": "hi"}


@pytest.fixture
def opened(tenant: Tenant, runtime: Runtime) -> tuple[console.Link, GatewayTool, Any]:
    config = parse_config(
        "[upstreams.shop]\nurl='http://x/mcp'\ntenant='acme'\nruntime_key_env='KEY'",
        environ={"KEY": runtime.raw_key},
    )
    link = console.link_for(config.upstreams[0])
    schema = {"type": "object", "properties": {"to": {}, "text": {}}}
    tool = gateway_tool(config.upstreams[0], types.Tool(name="send_message", input_schema=schema))
    console.contracts_register(config, [tool], {"shop": link})
    first = console.call_open(
        gateway="gw",
        link=link,
        tool=tool,
        arguments=ARGS,
        session_id="s1",
        request_id="7",
        reason="r",
    )
    return link, tool, first


def test_the_same_request_opens_one_call(opened: Any) -> None:
    link, tool, first = opened
    again = console.call_open(
        gateway="gw",
        link=link,
        tool=tool,
        arguments=ARGS,
        session_id="s1",
        request_id="7",
        reason="r",
    )
    assert again.call_id == first.call_id and again.occurrence_id == first.occurrence_id
    call = GatewayCall.objects.get()
    assert call.execution_id == "mcp:gw:s1:7" and call.state == GatewayCall.State.PROPOSED
    assert console.calls_open("gw") == [(call.pk, "proposed", "shop", "send_message")]


def test_claim_then_start_once(opened: Any, reviewer: Any) -> None:
    link, _, first = opened
    approve(str(first.occurrence_id), reviewer)

    claimed = console.call_claim(first.call_id, link)
    assert isinstance(claimed, console.Claimed) and claimed.arguments == ARGS
    command = Command.objects.get()
    assert claimed.idempotency_key == command.idempotency_key
    # A second claim (a restarted process) gets the same command, and no second claim event.
    assert console.call_claim(first.call_id, link) == claimed
    assert AuditEvent.objects.filter(kind=AuditKind.CLAIM_APPROVED).count() == 1

    assert console.call_start(first.call_id) is True
    assert console.call_start(first.call_id) is False  # one process makes the one call
    assert console.call_claim(first.call_id, link) is None


def test_a_report_the_console_refuses_still_closes_the_journal(opened: Any, reviewer: Any) -> None:
    link, _, first = opened
    approve(str(first.occurrence_id), reviewer)
    console.call_claim(first.call_id, link)
    console.call_start(first.call_id)
    command = Command.objects.get()
    # The effect was settled meanwhile (as an operator's reconcile would).
    command_report_effect(
        tenant=link.tenant,
        command_id=command.pk,
        execution_id=command.execution_id,
        outcome=ReportedOutcome.COMMITTED,
        actor="test",
    )

    console.call_settle(first.call_id, link, outcome=ReportedOutcome.OUTCOME_UNKNOWN)

    call = GatewayCall.objects.get()
    assert call.state == GatewayCall.State.DONE
    assert "report refused: effect_already_recorded" in call.detail
    command.refresh_from_db()
    assert command.state == Command.State.COMMITTED
    assert console.calls_open("gw") == []


def test_a_rejected_call_is_closed_without_a_claim(opened: Any, reviewer: Any) -> None:
    from approvals.models import Occurrence
    from approvals.reviews.decisions import occurrence_reject

    _, _, first = opened
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=first.occurrence_id), reviewer=reviewer, reason="No"
    )
    decision = console.call_decision(first.call_id)
    assert (decision.status, decision.reason) == ("rejected", "No")
    console.call_close(first.call_id, outcome=decision.status)
    assert GatewayCall.objects.get().state == GatewayCall.State.DONE
    assert not Command.objects.exists()
