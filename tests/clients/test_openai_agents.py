"""The OpenAI Agents SDK bridge with the real ``openai-agents`` package, its scripted model
(no network) and a live console. Each phase of a run is one ``asyncio.run`` with a new
client, bridge and agent, as a restarted process would build them, sharing nothing but the
``RunState`` JSON; reviewers decide between the phases."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from agents import Agent, Runner, RunState, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from approval_console import AsyncApprovalConsole
from approval_console.openai_agents import ConsoleBridge, Resolution

from approvals.models import Command, Occurrence
from tests.clients.conftest import CASE_ARGS, approve, audit_kinds, edit, expire, reject, run_async

pytestmark = pytest.mark.django_db(transaction=True)

RUN = "conversation-7"


class Crash(BaseException):
    """The process dies here."""


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # the SDK would otherwise export traces over the network
    yield


class Effects:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], str]] = []

    async def __call__(self, arguments: Mapping[str, Any], idempotency_key: str) -> str:
        self.calls.append((dict(arguments), idempotency_key))
        return f"{arguments['case_id']} closed"


class Process:
    """One process of the agent runtime: its client, bridge, tool and agent."""

    def __init__(
        self,
        url: str,
        key: str,
        replies: Sequence[Any],
        effects: Effects,
        client_class: type[AsyncApprovalConsole] = AsyncApprovalConsole,
    ) -> None:
        self.client = client_class(url, key)
        self.bridge = ConsoleBridge(self.client, RUN)
        self.model = ScriptedModel(replies)
        self.effects = effects

    async def agent(self) -> Agent[Any]:
        tool = await self.bridge.tool_from_contract("close_case", self.effects)
        return Agent(name="support", instructions="Help.", model=self.model, tools=[tool])


def first_phase(url: str, key: str, effects: Effects) -> tuple[dict[str, Any], str]:
    """The model asks for close_case; the run stops for approval; the bridge proposes it;
    the state is saved as JSON. Returns the saved state and the occurrence id."""

    async def run() -> tuple[dict[str, Any], str]:
        process = Process(
            url, key, [[function_call("close_case", CASE_ARGS, call_id="call_0")]], effects
        )
        agent = await process.agent()
        result = await Runner.run(agent, "Close case 77, it is solved.")
        (item,) = result.interruptions
        assert item.name == "close_case"
        (proposed,) = await process.bridge.submit(result.interruptions)
        again = await process.bridge.submit(result.interruptions)
        assert again[0].occurrence_id == proposed.occurrence_id and not again[0].created
        saved = json.loads(json.dumps(result.to_state().to_json()))
        await process.client.aclose()
        return saved, proposed.occurrence_id

    return run_async(run())


def resume(
    url: str,
    key: str,
    saved: dict[str, Any],
    replies: Sequence[Any],
    effects: Effects,
    client_class: type[AsyncApprovalConsole] = AsyncApprovalConsole,
) -> tuple[Resolution, Any, Process]:
    """A later process: load the state, apply the console's decisions, run if decided."""

    async def run() -> tuple[Resolution, Any, Process]:
        process = Process(url, key, replies, effects, client_class)
        try:
            agent = await process.agent()
            state = await RunState.from_json(agent, saved)
            resolution = await process.bridge.resolve(state)
            result = await Runner.run(agent, state) if resolution.ready else None
        finally:
            await process.client.aclose()
        return resolution, result, process

    return run_async(run())


def test_happy_path_across_serialization_and_a_restart(
    live_server: Any, runtime: Any, reviewer: Any
):
    url, key, effects = live_server.url, runtime.raw_key, Effects()
    saved, occurrence_id = first_phase(url, key, effects)
    assert "apv_" not in json.dumps(saved)

    # Not decided yet: nothing is approved in the state, nothing runs.
    resolution, result, _ = resume(url, key, saved, [], effects)
    assert resolution.pending == ["call_0"] and result is None

    approve(occurrence_id, reviewer)
    resolution, result, process = resume(
        url, key, saved, [[assistant_message("Case 77 is closed.")]], effects
    )
    assert resolution.approved == ["call_0"]
    assert result.final_output == "Case 77 is closed."
    (outcome,) = process.bridge.outcomes
    assert outcome.status == "executed"
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert effects.calls == [(CASE_ARGS, command.idempotency_key)]
    assert command.state == Command.State.COMMITTED
    assert Occurrence.objects.get(pk=occurrence_id).run_id == RUN
    assert "apv_" not in json.dumps(result.to_state().to_json())


def test_the_same_saved_state_resumed_twice_runs_the_tool_once(
    live_server: Any, runtime: Any, reviewer: Any
):
    url, key, effects = live_server.url, runtime.raw_key, Effects()
    saved, occurrence_id = first_phase(url, key, effects)
    approve(occurrence_id, reviewer)
    resume(url, key, saved, [[assistant_message("Closed.")]], effects)
    # A crash after the claim (or an operator re-running the saved state): the SDK runs the
    # tool again; the console's single-use claim makes it a no-op.
    _, result, process = resume(url, key, saved, [[assistant_message("Closed.")]], effects)
    (outcome,) = process.bridge.outcomes
    assert outcome.status == "already_executed"
    assert len(effects.calls) == 1
    assert Command.objects.filter(occurrence_id=occurrence_id).count() == 1
    assert audit_kinds(occurrence_id).count("claim.approved") == 1
    assert result.final_output == "Closed."


class ClaimCrashes(AsyncApprovalConsole):
    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        raise Crash


def test_crash_between_pickup_and_claim_is_recovered_by_redelivery(
    live_server: Any, runtime: Any, reviewer: Any
):
    url, key, effects = live_server.url, runtime.raw_key, Effects()
    saved, occurrence_id = first_phase(url, key, effects)
    approve(occurrence_id, reviewer)
    with pytest.raises(Crash):
        resume(url, key, saved, [[assistant_message("Closed.")]], effects, ClaimCrashes)
    assert effects.calls == []

    _, result, process = resume(url, key, saved, [[assistant_message("Closed.")]], effects)
    assert process.bridge.outcomes[0].status == "executed" and result.final_output == "Closed."
    assert len(effects.calls) == 1
    assert Command.objects.filter(occurrence_id=occurrence_id).count() == 1
    kinds = audit_kinds(occurrence_id)
    assert kinds.count("token.redelivered") == 1 and kinds.count("claim.approved") == 1


def test_rejection_reaches_the_model_and_a_retry_is_not_proposed_again(
    live_server: Any, runtime: Any, reviewer: Any
):
    url, key, effects = live_server.url, runtime.raw_key, Effects()
    saved, occurrence_id = first_phase(url, key, effects)
    reject(occurrence_id, reviewer, "Case 77 has an open refund.")

    async def run() -> tuple[Resolution, Resolution, Any, Process]:
        # The model retries the rejected call under a new call id, then gives up.
        replies = [
            [function_call("close_case", CASE_ARGS, call_id="call_1")],
            [assistant_message("I did not close it.")],
        ]
        process = Process(url, key, replies, effects)
        agent = await process.agent()
        state = await RunState.from_json(agent, saved)
        first = await process.bridge.resolve(state)
        result = await Runner.run(agent, state)
        (retry,) = result.interruptions
        assert retry.call_id == "call_1"
        state = result.to_state()
        second = await process.bridge.resolve(state)
        result = await Runner.run(agent, state)
        await process.client.aclose()
        return first, second, result, process

    first, second, result, process = run_async(run())
    assert first.rejected == {"call_0": "Case 77 has an open refund."}
    assert second.rejected == {"call_1": "Case 77 has an open refund."} and second.ready
    assert result.final_output == "I did not close it."
    last_call = process.model.last_call
    assert last_call is not None
    outputs = [
        str(item["output"])
        for item in last_call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert len(outputs) == 2
    assert all("Case 77 has an open refund." in output for output in outputs)
    assert "already rejected" in outputs[1]
    assert not any(".." in output for output in outputs)  # the reason's own stop, once
    assert effects.calls == [] and process.bridge.outcomes == []
    assert Occurrence.objects.count() == 1  # the retry never reached the inbox
    assert not Command.objects.exists()


def test_the_reviewers_edit_is_what_runs(
    live_server: Any, runtime: Any, reviewer: Any, second_reviewer: Any
):
    url, key, effects = live_server.url, runtime.raw_key, Effects()
    saved, occurrence_id = first_phase(url, key, effects)
    edit(occurrence_id, reviewer, {"case_id": "case_78"})
    approve(occurrence_id, second_reviewer)
    _, _, process = resume(url, key, saved, [[assistant_message("Done.")]], effects)
    (outcome,) = process.bridge.outcomes
    assert outcome.status == "executed" and outcome.edited_by == "rita"
    assert [arguments for arguments, _ in effects.calls] == [{"case_id": "case_78"}]
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    current = Occurrence.objects.get(pk=occurrence_id).proposals.get(is_current=True)
    assert command.action_digest == current.action_digest


def test_a_run_paused_past_expiry_is_renewed(
    live_server: Any, runtime: Any, reviewer: Any, second_reviewer: Any
):
    url, key, effects = live_server.url, runtime.raw_key, Effects()
    saved, occurrence_id = first_phase(url, key, effects)
    approve(occurrence_id, reviewer)
    expire(occurrence_id)

    resolution, result, _ = resume(url, key, saved, [], effects)
    assert resolution.pending == ["call_0"] and result is None
    assert Occurrence.objects.get(pk=occurrence_id).status == Occurrence.Status.PENDING_REVIEW
    assert "occurrence.renewed" in audit_kinds(occurrence_id)

    approve(occurrence_id, second_reviewer)
    resolution, result, _ = resume(url, key, saved, [[assistant_message("Done.")]], effects)
    assert resolution.approved == ["call_0"] and result.final_output == "Done."
    assert len(effects.calls) == 1
    assert Command.objects.filter(occurrence_id=occurrence_id).count() == 1
