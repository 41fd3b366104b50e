"""The LangGraph adapter with the real ``langgraph`` package, a fake chat model (no network)
and a live console: interrupt for the human, resume, claim, run once; crashes recovered by
re-delivery; rejections told to the model without a second proposal; a reviewer's edit; a
pause past expiry renewed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from approval_console import ApprovalConsole
from approval_console.langgraph import gated_tool, tool_node
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command as Resume

from approvals.models import Command, Occurrence
from tests.clients.conftest import CASE_ARGS, approve, audit_kinds, edit, expire, reject

pytestmark = pytest.mark.django_db(transaction=True)

THREAD = {"configurable": {"thread_id": "thread-1"}}


class Crash(BaseException):
    """The process dies here (not an error any code would catch)."""


def call(call_id: str, arguments: Mapping[str, Any] = CASE_ARGS) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[{"name": "close_case", "args": dict(arguments), "id": call_id}],
    )


class Effects:
    """The CRM the tool closes cases in: every real call is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], str]] = []

    def __call__(self, arguments: Mapping[str, Any], idempotency_key: str) -> str:
        self.calls.append((dict(arguments), idempotency_key))
        return f"{arguments['case_id']} closed"


def graph(
    console: ApprovalConsole,
    checkpointer: InMemorySaver,
    replies: list[AIMessage],
    execute: Callable[[Mapping[str, Any], str], Any],
) -> Any:
    """The agent as a process builds it: a fake model answering ``replies`` in order, and a
    tool node whose close_case calls go through the console."""
    model = GenericFakeChatModel(messages=iter(replies))

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    # A process finding this execution's claim without an effect waits this long for the
    # process that claimed before taking it for dead (the crash tests' restarts).
    gate = gated_tool(console, "close_case", execute, effect_timeout=1)
    builder.add_node("tools", tool_node(gate))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def start(app: Any) -> str:
    """Run until the review interrupt; the occurrence id it names."""
    result = app.invoke({"messages": [HumanMessage("Close case 77, it is solved.")]}, THREAD)
    (pause,) = result["__interrupt__"]
    info = pause.value["approval_console"]
    assert info["status"] == "pending_review" and info["arguments"] == CASE_ARGS
    return str(info["occurrence_id"])


def tool_messages(result: Mapping[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def no_token_in(checkpointer: InMemorySaver) -> bool:
    blobs = repr(checkpointer.storage) + repr(checkpointer.writes) + repr(checkpointer.blobs)
    return "apv_" not in blobs


def test_happy_path(console: ApprovalConsole, reviewer: Any):
    saver, effects = InMemorySaver(), Effects()
    app = graph(console, saver, [call("call_0"), AIMessage("Case 77 is closed.")], effects)
    occurrence_id = start(app)
    assert effects.calls == []
    approve(occurrence_id, reviewer)

    result = app.invoke(Resume(resume="decided"), THREAD)
    assert "__interrupt__" not in result
    (answer,) = tool_messages(result)
    assert answer.status == "success" and "case_77 closed" in answer.text
    assert result["messages"][-1].text == "Case 77 is closed."
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert effects.calls == [(CASE_ARGS, command.idempotency_key)]
    assert command.state == Command.State.COMMITTED
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    assert occurrence.run_id == "thread-1" and "call_0" in occurrence.client_ref
    assert no_token_in(saver)


class ClaimCrashes(ApprovalConsole):
    """Dies after the token was picked up, before the claim is sent."""

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        raise Crash


class DiesAfterReporting(ApprovalConsole):
    """Dies after the effect was reported, before the graph could checkpoint the node."""

    def report_effect(self, *args: Any, **kwargs: Any) -> Any:
        super().report_effect(*args, **kwargs)
        raise Crash


def test_crash_between_pickup_and_claim_is_recovered_by_redelivery(
    reviewer: Any, console_factory: Any
):
    saver, effects = InMemorySaver(), Effects()
    replies: list[AIMessage] = [call("call_0")]
    first = console_factory(ClaimCrashes)
    occurrence_id = start(graph(first, saver, replies, effects))
    approve(occurrence_id, reviewer)
    with pytest.raises(Crash):
        graph(first, saver, [], effects).invoke(Resume(resume="decided"), THREAD)
    assert Occurrence.objects.get(pk=occurrence_id).approvals.get().delivered_at is not None

    # A new process: a new client and graph on the same checkpointer, resuming the thread.
    restarted = graph(console_factory(), saver, [AIMessage("Closed.")], effects)
    result = restarted.invoke(None, THREAD)
    (answer,) = tool_messages(result)
    assert answer.status == "success"
    assert len(effects.calls) == 1
    assert Command.objects.filter(occurrence_id=occurrence_id).count() == 1
    kinds = audit_kinds(occurrence_id)
    assert kinds.count("token.delivered") == 1 and kinds.count("token.redelivered") == 1
    assert kinds.count("claim.approved") == 1
    assert no_token_in(saver)


def test_crash_after_claim_runs_nothing_twice(reviewer: Any, console_factory: Any):
    saver, effects = InMemorySaver(), Effects()
    first = console_factory(DiesAfterReporting)
    occurrence_id = start(graph(first, saver, [call("call_0")], effects))
    approve(occurrence_id, reviewer)
    with pytest.raises(Crash):
        graph(first, saver, [], effects).invoke(Resume(resume="decided"), THREAD)
    assert len(effects.calls) == 1

    restarted = graph(console_factory(), saver, [AIMessage("Closed.")], effects)
    result = restarted.invoke(None, THREAD)
    (answer,) = tool_messages(result)
    assert answer.status == "success" and "not run again" in answer.text
    assert len(effects.calls) == 1  # no second effect
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)  # no second command
    assert command.state == Command.State.COMMITTED
    kinds = audit_kinds(occurrence_id)
    assert kinds.count("claim.approved") == 1 and "token.redelivered" not in kinds


def test_crash_in_the_tool_after_claim_is_left_to_an_operator(
    console: ApprovalConsole, reviewer: Any, console_factory: Any
):
    """close_case is ``unsafe``: a runtime that died after claiming cannot tell whether the
    call ran, so it does not run it again; the effect becomes outcome_unknown."""
    saver, effects = InMemorySaver(), Effects()

    def dies_midway(arguments: Mapping[str, Any], key: str) -> str:
        effects(arguments, key)
        raise Crash

    occurrence_id = start(graph(console, saver, [call("call_0")], dies_midway))
    approve(occurrence_id, reviewer)
    with pytest.raises(Crash):
        graph(console, saver, [], dies_midway).invoke(Resume(resume="decided"), THREAD)

    restarted = graph(console_factory(), saver, [AIMessage("I could not confirm.")], effects)
    result = restarted.invoke(None, THREAD)
    (answer,) = tool_messages(result)
    assert answer.status == "error" and "unknown" in answer.text
    assert len(effects.calls) == 1
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert command.state == Command.State.OUTCOME_UNKNOWN


def test_rejection_is_told_once_and_not_proposed_again(console: ApprovalConsole, reviewer: Any):
    saver, effects = InMemorySaver(), Effects()
    # The model retries the rejected call under a new tool-call id, then gives up.
    replies: list[AIMessage] = [call("call_0"), call("call_1"), AIMessage("I will not.")]
    app = graph(console, saver, replies, effects)
    occurrence_id = start(app)
    reject(occurrence_id, reviewer, "The customer is still waiting for a refund.")

    result = app.invoke(Resume(resume="decided"), THREAD)
    assert "__interrupt__" not in result
    first, second = tool_messages(result)
    assert first.status == "error"
    assert "The customer is still waiting for a refund." in first.text
    assert second.status == "error" and "already rejected" in second.text
    assert "The customer is still waiting for a refund." in second.text
    assert ".." not in first.text and ".." not in second.text  # the reason's own stop, once
    assert Occurrence.objects.count() == 1  # no second proposal reached the inbox
    assert effects.calls == []
    assert result["messages"][-1].text == "I will not."


def test_the_reviewers_edit_is_what_runs(
    console: ApprovalConsole, reviewer: Any, second_reviewer: Any
):
    saver, effects = InMemorySaver(), Effects()
    app = graph(console, saver, [call("call_0"), AIMessage("Done.")], effects)
    occurrence_id = start(app)
    edit(occurrence_id, reviewer, {"case_id": "case_78"})
    approve(occurrence_id, second_reviewer)

    result = app.invoke(Resume(resume="decided"), THREAD)
    (answer,) = tool_messages(result)
    assert answer.status == "success" and "case_78" in answer.text and "rita" in answer.text
    assert [arguments for arguments, _ in effects.calls] == [{"case_id": "case_78"}]
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    current = Occurrence.objects.get(pk=occurrence_id).proposals.get(is_current=True)
    assert command.action_digest == current.action_digest and current.version == 2


def test_a_run_paused_past_expiry_is_renewed_and_reviewed_again(
    console: ApprovalConsole, reviewer: Any, second_reviewer: Any
):
    saver, effects = InMemorySaver(), Effects()
    app = graph(console, saver, [call("call_0"), AIMessage("Done.")], effects)
    occurrence_id = start(app)
    approve(occurrence_id, reviewer)
    expire(occurrence_id)  # the run stayed paused past the approval's lifetime

    paused = app.invoke(Resume(resume="decided"), THREAD)
    (pause,) = paused["__interrupt__"]
    assert pause.value["approval_console"]["status"] == "pending_review"
    assert effects.calls == []
    assert "occurrence.renewed" in audit_kinds(occurrence_id)

    approve(occurrence_id, second_reviewer)
    result = app.invoke(Resume(resume="decided again"), THREAD)
    (answer,) = tool_messages(result)
    assert answer.status == "success"
    assert len(effects.calls) == 1
    assert Command.objects.filter(occurrence_id=occurrence_id).count() == 1
