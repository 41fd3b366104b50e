"""The OpenAI Agents SDK bridge tells the model what happened (issue 27, section 1): the
real ``openai-agents`` package, its scripted model and a live console, each phase a new
process sharing only the saved ``RunState``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from agents import Agent, Runner, RunState, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from approval_console import AsyncApprovalConsole
from approval_console.openai_agents import ConsoleBridge
from django.db import connection

from approvals.models import Command, Occurrence
from reconciliation.dispatch import command_dispatch
from tests.clients.conftest import CASE_ARGS, approve, audit_kinds, edit, reject, run_async
from tests.clients.test_adapters_truth import in_thread
from tests.clients.test_openai_agents import Effects, Process, first_phase, resume
from tests.demo.sandbox_fixture import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # the SDK would otherwise export traces over the network
    yield


def tool_outputs(process: Any) -> list[str]:
    """The tool outputs the model was shown in its last call."""
    last_call = process.model.last_call
    assert last_call is not None
    return [
        str(item["output"])
        for item in last_call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def test_the_reviewers_edit_is_told_to_the_model(
    live_server: Any, runtime: Any, reviewer: Any, second_reviewer: Any
):
    """D2: the tool ran with the reviewer's case_78; the model reads that the reviewer
    changed case_id, from what to what."""
    url, key, effects = live_server.url, runtime.raw_key, Effects()
    saved, occurrence_id = first_phase(url, key, effects)
    edit(occurrence_id, reviewer, {"case_id": "case_78"})
    approve(occurrence_id, second_reviewer)
    _, result, process = resume(url, key, saved, [[assistant_message("Done.")]], effects)
    assert result.final_output == "Done."
    (output,) = tool_outputs(process)
    assert 'case_id from "case_77" to "case_78"' in output and "rita" in output
    assert [arguments for arguments, _ in effects.calls] == [{"case_id": "case_78"}]
    assert Command.objects.get(occurrence_id=occurrence_id).state == Command.State.COMMITTED
    assert Occurrence.objects.count() == 1


def test_a_rejected_action_retried_in_a_new_run_state_is_not_proposed_again(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D3: the run's saved state is gone; under the same run id the model asks again for
    the action a reviewer rejected. submit() proposes nothing (the inbox keeps one
    request) and resolve() rejects it with the earlier reason."""
    url, key, effects = live_server.url, runtime.raw_key, Effects()
    _, occurrence_id = first_phase(url, key, effects)
    reject(occurrence_id, reviewer, "Case 77 has an open refund.")

    async def run() -> tuple[list[Any], dict[str, str], Any, Any, Process]:
        replies = [
            [function_call("close_case", CASE_ARGS, call_id="call_5")],
            [assistant_message("I did not close it.")],
        ]
        process = Process(url, key, replies, effects)
        agent = await process.agent()
        result = await Runner.run(agent, "Close case 77.")
        proposed = await process.bridge.submit(result.interruptions)
        state = result.to_state()
        resolution = await process.bridge.resolve(state)
        result = await Runner.run(agent, state)
        await process.client.aclose()
        return proposed, process.bridge.refused, resolution, result, process

    proposed, refused, resolution, result, process = run_async(run())
    assert proposed == [] and refused == {"call_5": "Case 77 has an open refund."}
    assert resolution.rejected == {"call_5": "Case 77 has an open refund."} and resolution.ready
    assert result.final_output == "I did not close it."
    (output,) = tool_outputs(process)
    assert "already rejected" in output and "Case 77 has an open refund." in output
    assert Occurrence.objects.count() == 1
    assert effects.calls == [] and not Command.objects.exists()


def test_two_calls_of_one_response_are_proposed_together_and_waited_for_together(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D7: both interruptions of one model response are in the inbox before any review,
    and ``wait`` returns once both are decided; then each runs once."""
    url, key, effects = live_server.url, runtime.raw_key, Effects()

    async def propose() -> tuple[dict[str, Any], list[str]]:
        replies = [
            [
                function_call("close_case", {"case_id": "case_77"}, call_id="call_0"),
                function_call("close_case", {"case_id": "case_78"}, call_id="call_1"),
            ]
        ]
        process = Process(url, key, replies, effects)
        result = await Runner.run(await process.agent(), "Close 77 and 78.")
        proposed = await process.bridge.submit(result.interruptions)
        saved = json.loads(json.dumps(result.to_state().to_json()))
        await process.client.aclose()
        return saved, [p.occurrence_id for p in proposed]

    async def resume_when_decided(saved: dict[str, Any]) -> tuple[Any, Any]:
        process = Process(url, key, [[assistant_message("Both closed.")]], effects)
        agent = await process.agent()
        state = await RunState.from_json(agent, saved)
        resolution = await process.bridge.wait(state, timeout=30)
        result = await Runner.run(agent, state)
        await process.client.aclose()
        return resolution, result

    saved, both = run_async(propose())
    assert len(both) == 2
    assert Occurrence.objects.filter(status="pending_review").count() == 2
    for occurrence_id in both:
        approve(occurrence_id, reviewer)
    resolution, result = run_async(resume_when_decided(saved))
    assert sorted(resolution.approved) == ["call_0", "call_1"] and resolution.ready
    assert result.final_output == "Both closed."
    assert sorted(a["case_id"] for a, _ in effects.calls) == ["case_77", "case_78"]
    assert Command.objects.filter(state=Command.State.COMMITTED).count() == 2


REFUND = {"payment_id": "pay_123", "amount_minor": 7700, "currency": "EUR", "reason": "Late"}


class DeliveringConsole(AsyncApprovalConsole):
    """A client whose console-executed claims the console's worker delivers a moment later
    (a thread calling the dispatch service, as the Celery task does)."""

    workers: list[threading.Thread] = []

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        claimed = await super().claim(*args, **kwargs)
        if claimed.executed_by == "console":
            worker = threading.Thread(target=_deliver, args=(claimed.command_id,))
            worker.start()
            self.workers.append(worker)
        return claimed


def _deliver(command_id: str) -> None:
    try:
        time.sleep(0.5)
        command_dispatch(command_id=command_id)
    finally:
        connection.close()


async def never_runs(arguments: Mapping[str, Any], key: str) -> str:
    raise AssertionError("a console-executed tool never runs in the runtime")


def test_a_declined_console_refund_is_no_success_to_the_model(
    live_server: Any, runtime: Any, reviewer: Any, payments: SandboxProcess
):
    """D1 through the bridge: the payments service declines the approved refund; the
    model reads that it was refused and nothing took effect, not "Approved"."""
    url, key = live_server.url, runtime.raw_key

    async def propose() -> tuple[dict[str, Any], str]:
        client = AsyncApprovalConsole(url, key)
        bridge = ConsoleBridge(client, "conversation-27")
        tool = await bridge.tool_from_contract("issue_refund", never_runs)
        model = ScriptedModel([[function_call("issue_refund", REFUND, call_id="call_0")]])
        agent = Agent(name="support", instructions="Help.", model=model, tools=[tool])
        result = await Runner.run(agent, "Refund my parcel.")
        (proposed,) = await bridge.submit(result.interruptions)
        saved = json.loads(json.dumps(result.to_state().to_json()))
        await client.aclose()
        return saved, proposed.occurrence_id

    async def resume(saved: dict[str, Any]) -> tuple[Any, ConsoleBridge, ScriptedModel]:
        client = DeliveringConsole(url, key, long_poll=True)
        bridge = ConsoleBridge(client, "conversation-27", effect_timeout=20)
        tool = await bridge.tool_from_contract("issue_refund", never_runs)
        model = ScriptedModel([[assistant_message("It was declined.")]])
        agent = Agent(name="support", instructions="Help.", model=model, tools=[tool])
        state = await RunState.from_json(agent, saved)
        assert (await bridge.resolve(state)).ready
        result = await Runner.run(agent, state)
        await client.aclose()
        return result, bridge, model

    saved, occurrence_id = run_async(propose())
    approve(occurrence_id, reviewer)
    payments.fault("declined")
    result, bridge, model = run_async(resume(saved))
    for worker in DeliveringConsole.workers:
        worker.join()
    assert result.final_output == "It was declined."
    (outcome,) = bridge.outcomes
    assert outcome.status == "failed" and not outcome.ok
    last_call = model.last_call
    assert last_call is not None
    (output,) = [
        str(item["output"])
        for item in last_call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert "refused" in output and "Nothing took effect" in output
    assert "Approved" not in output
    assert payments.refunds() == []
    assert Command.objects.get(occurrence_id=occurrence_id).state == Command.State.REJECTED


class Blocking(Effects):
    """A CRM call that holds until released: the winner is still running the tool."""

    def __init__(self) -> None:
        super().__init__()
        self.running, self.release = threading.Event(), threading.Event()

    async def __call__(self, arguments: Mapping[str, Any], idempotency_key: str) -> str:
        self.running.set()
        assert await asyncio.to_thread(self.release.wait, 30)
        return await super().__call__(arguments, idempotency_key)


class Watched(AsyncApprovalConsole):
    """A process's client: tells when it starts waiting for an effect, can hold its claim,
    and counts its effect reports (on its class: the process builds the instance)."""

    waiting: threading.Event
    reports: int
    hold_claim: tuple[threading.Event, threading.Event] | None

    async def watch(self, *args: Any, **kwargs: Any) -> Any:
        type(self).waiting.set()
        return await super().watch(*args, **kwargs)

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        hold = type(self).hold_claim
        if hold is not None:
            picked, go = hold
            picked.set()
            assert await asyncio.to_thread(go.wait, 30)
        return await super().claim(*args, **kwargs)

    async def report_effect(self, *args: Any, **kwargs: Any) -> Any:
        type(self).reports += 1
        return await super().report_effect(*args, **kwargs)


def watched() -> type[Watched]:
    """The client class of one process, with its own counters."""

    class OneProcess(Watched):
        waiting = threading.Event()
        reports = 0
        hold_claim = None

    return OneProcess


def resumed_in_thread(
    url: str, key: str, saved: dict[str, Any], effects: Effects, client: type[Any]
) -> tuple[threading.Thread, list[Any]]:
    """A process resuming the saved state (its own client, bridge, agent and loop)."""
    return in_thread(
        lambda: resume(url, key, saved, [[assistant_message("Done.")]], effects, client)
    )


def outcome_of(out: list[Any]) -> Any:
    ((_, result, process),) = out
    assert result.final_output == "Done."
    (outcome,) = process.bridge.outcomes
    return outcome


def test_a_second_process_resuming_the_same_state_waits_for_the_first(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D5 through the bridge: two processes resume one saved state. The winner claimed and
    is still running the tool when the loser's tool starts: the loser waits for the
    winner's effect and tells the model that; no UserError, no outcome_unknown, no second
    effect, no report of its own."""
    url, key, crm = live_server.url, runtime.raw_key, Blocking()
    saved, occurrence_id = first_phase(url, key, crm)
    approve(occurrence_id, reviewer)
    first, second = watched(), watched()

    winner, won = resumed_in_thread(url, key, saved, crm, first)
    assert crm.running.wait(30)
    loser, lost = resumed_in_thread(url, key, saved, crm, second)
    assert second.waiting.wait(30)
    crm.release.set()
    winner.join(60)
    loser.join(60)

    assert outcome_of(won).status == "executed"
    late = outcome_of(lost)
    assert late.status == "already_executed" and "already executed" in late.message
    assert len(crm.calls) == 1
    assert (first.reports, second.reports) == (1, 0)
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert command.state == Command.State.COMMITTED
    assert not [k for k in audit_kinds(occurrence_id) if "unknown" in k]


def test_a_process_whose_token_was_picked_up_again_waits_instead_of_raising(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D5: the first process picked the token up; before it claimed, a second one of the
    same execution picked it up again (voiding the first's) and ran the tool. The first's
    claim is refused as replayed: it waits for the second's outcome and reports nothing."""
    url, key, crm = live_server.url, runtime.raw_key, Effects()
    saved, occurrence_id = first_phase(url, key, crm)
    approve(occurrence_id, reviewer)
    first, second = watched(), watched()
    picked, go = threading.Event(), threading.Event()
    first.hold_claim = (picked, go)

    slow, slow_out = resumed_in_thread(url, key, saved, crm, first)
    assert picked.wait(30)
    fast, fast_out = resumed_in_thread(url, key, saved, crm, second)
    fast.join(60)
    go.set()
    slow.join(60)

    assert outcome_of(fast_out).status == "executed"
    late = outcome_of(slow_out)
    assert late.status == "already_executed" and "already executed" in late.message
    assert len(crm.calls) == 1
    assert (first.reports, second.reports) == (0, 1)
    kinds = audit_kinds(occurrence_id)
    assert kinds.count("claim.approved") == 1 and kinds.count("token.redelivered") == 1
