"""What the adapters tell the model is what happened (issue 27, section 1), with the real
``langgraph``/``langchain-core`` and ``openai-agents`` packages, fake models and a live
console: a console-executed refund's true effect, a reviewer's edit, a rejected action
retried, reused tool-call ids, racing resumes and several calls in one message."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from approval_console import ApprovalConsole
from approval_console.langgraph import GatedTool, gated_tool, tool_node
from django.db import connection
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command as Resume

from approvals.models import Command, Occurrence
from reconciliation.dispatch import command_dispatch
from tests.clients.conftest import approve, audit_kinds, edit, reject
from tests.demo.sandbox_fixture import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

THREAD = {"configurable": {"thread_id": "thread-27"}}
REFUND = {"payment_id": "pay_123", "amount_minor": 7700, "currency": "EUR", "reason": "Late"}


def ai_calls(*calls: tuple[str, str, Mapping[str, Any]]) -> AIMessage:
    """One model message with these (tool, call id, arguments) calls."""
    return AIMessage(
        content="",
        tool_calls=[{"name": n, "args": dict(a), "id": i} for n, i, a in calls],
    )


def graph(saver: InMemorySaver, replies: Sequence[AIMessage], *gates: GatedTool) -> Any:
    """An agent process: a fake model answering ``replies`` in order and a tool node."""
    model = GenericFakeChatModel(messages=iter(replies))

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tool_node(*gates))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def paused_on(result: Mapping[str, Any]) -> list[str]:
    """The occurrence ids the graph's interrupt waits for."""
    (pause,) = result["__interrupt__"]
    info = pause.value["approval_console"]
    return [str(p["occurrence_id"]) for p in info.get("calls", [info])]


def tool_messages(result: Mapping[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def _deliver(command_id: str, delay: float) -> None:
    try:
        time.sleep(delay)
        command_dispatch(command_id=command_id)
    finally:
        connection.close()


class ConsoleWorker(ApprovalConsole):
    """A client whose claims of console-executed commands are delivered a moment later by
    "the console's worker" (a thread calling the dispatch service, as the Celery task does),
    while the gate waits; ``deliver=False`` is a worker that never comes."""

    deliver = True
    threads: list[threading.Thread]

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        claimed = super().claim(*args, **kwargs)
        if claimed.executed_by == "console" and self.deliver:
            worker = threading.Thread(target=_deliver, args=(claimed.command_id, 0.5))
            worker.start()
            self.threads = [*getattr(self, "threads", []), worker]
        return claimed


MESSAGE = {"to": "customer@example.com", "subject": "Refund", "body": "Refunded."}


def noop(arguments: Mapping[str, Any], key: str) -> Any:
    raise AssertionError("a console-executed tool never runs in the runtime")


def console_graph(
    client: ApprovalConsole,
    saver: InMemorySaver,
    replies: Sequence[AIMessage],
    tool: str = "issue_refund",
    **options: Any,
) -> Any:
    return graph(saver, replies, gated_tool(client, tool, noop, **options))


def effects(sandbox: SandboxProcess, tool: str) -> int:
    return len(sandbox.refunds() if tool == "issue_refund" else sandbox.messages())


@pytest.mark.parametrize(
    ("tool", "fault", "status", "says", "count"),
    [
        ("issue_refund", None, "success", ["took effect", "receipt re_"], 1),
        # The payments API answers queries: the console finds the refund it did not hear of.
        ("issue_refund", "timeout_after_effect", "success", ["took effect"], 1),
        ("issue_refund", "declined", "error", ["refused", "Nothing took effect"], 0),
        ("issue_refund", "unauthorized", "error", ["authentication", "Nothing has happened"], 0),
        (
            "send_message",
            "timeout_after_effect",
            "error",
            ["an operator will decide", "not retry"],
            1,
        ),
    ],
)
def test_a_console_executed_call_is_reported_as_its_effect(
    live_server: Any,
    runtime: Any,
    reviewer: Any,
    payments: SandboxProcess,
    tool: str,
    fault: str | None,
    status: str,
    says: list[str],
    count: int,
):
    """D1: the node waits (long-poll) for the console's effect and tells the model the
    truth: never "Approved" for a refund the payments service declined."""
    client = ConsoleWorker(live_server.url, runtime.raw_key, long_poll=True)
    saver = InMemorySaver()
    arguments = REFUND if tool == "issue_refund" else MESSAGE
    replies = [ai_calls((tool, "call_0", arguments)), AIMessage("Told the user.")]
    app = console_graph(client, saver, replies, tool, effect_timeout=20)
    started = app.invoke({"messages": [HumanMessage("Refund my parcel.")]}, THREAD)
    (occurrence_id,) = paused_on(started)
    approve(occurrence_id, reviewer)
    payments.fault(fault)

    result = app.invoke(Resume(resume="decided"), THREAD)
    for worker in client.threads:
        worker.join()
    client.close()
    (answer,) = tool_messages(result)
    assert answer.status == status
    for words in says:
        assert words in answer.text
    assert "Approved" not in answer.text
    assert effects(payments, tool) == count
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert command.executed_by == "console"


def test_a_console_effect_not_recorded_in_time_is_not_called_done(
    live_server: Any, runtime: Any, reviewer: Any, payments: SandboxProcess
):
    """The wait is bounded: past ``effect_timeout`` the model hears the effect is not
    known yet, and neither success nor failure."""
    client = ConsoleWorker(live_server.url, runtime.raw_key, long_poll=True)
    client.deliver = False
    saver = InMemorySaver()
    replies = [ai_calls(("issue_refund", "call_0", REFUND)), AIMessage("Pending.")]
    app = console_graph(client, saver, replies, effect_timeout=1)
    (occurrence_id,) = paused_on(app.invoke({"messages": [HumanMessage("Refund.")]}, THREAD))
    approve(occurrence_id, reviewer)

    began = time.monotonic()
    result = app.invoke(Resume(resume="decided"), THREAD)
    client.close()
    assert time.monotonic() - began < 15
    (answer,) = tool_messages(result)
    assert answer.status == "error"
    assert "not known yet" in answer.text and "do not tell the user it is done" in answer.text
    assert payments.refunds() == []
    assert "claim.approved" in audit_kinds(occurrence_id)


def test_a_reviewers_edit_of_a_console_executed_refund_is_told_to_the_model(
    live_server: Any, runtime: Any, reviewer: Any, second_reviewer: Any, payments: SandboxProcess
):
    """D2: the reviewer cut the refund from 7,700 to 5,000; the model hears what changed,
    to what, and that the refund of 50.00 is what took effect, not its 77.00."""
    client = ConsoleWorker(live_server.url, runtime.raw_key, long_poll=True)
    saver = InMemorySaver()
    replies = [ai_calls(("issue_refund", "call_0", REFUND)), AIMessage("Refunded EUR 50.00.")]
    app = console_graph(client, saver, replies, effect_timeout=20)
    (occurrence_id,) = paused_on(app.invoke({"messages": [HumanMessage("Refund.")]}, THREAD))
    edit(occurrence_id, reviewer, {**REFUND, "amount_minor": 5000})
    approve(occurrence_id, second_reviewer)

    result = app.invoke(Resume(resume="decided"), THREAD)
    for worker in client.threads:
        worker.join()
    client.close()
    (answer,) = tool_messages(result)
    assert answer.status == "success" and "took effect" in answer.text
    assert "A reviewer (rita) changed the arguments" in answer.text
    assert "amount_minor from 7700 to 5000" in answer.text
    assert answer.artifact["approval_console"]["edited_by"] == "rita"
    (refund,) = payments.refunds()
    assert refund["amount_minor"] == 5000


class Effects:
    """The CRM close_case closes cases in: every real call is recorded."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, arguments: Mapping[str, Any], idempotency_key: str) -> str:
        self.calls.append(dict(arguments))
        return f"{arguments['case_id']} closed"


def case(case_id: str) -> dict[str, str]:
    return {"case_id": case_id}


def test_a_tool_call_id_reused_in_a_later_turn_for_another_action_is_a_new_request(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D6: the model says ``call_0`` again in the next turn, for another case. That is a
    new request (client_ref from call id and action digest), not a ClientRefConflict that
    crashes the graph; each case is closed once."""
    client = ApprovalConsole(live_server.url, runtime.raw_key)
    saver, crm = InMemorySaver(), Effects()
    replies = [
        ai_calls(("close_case", "call_0", case("case_77"))),
        AIMessage("Closed 77."),
        ai_calls(("close_case", "call_0", case("case_78"))),
        AIMessage("Closed 78."),
    ]
    app = graph(saver, replies, gated_tool(client, "close_case", crm))
    (first,) = paused_on(app.invoke({"messages": [HumanMessage("Close 77.")]}, THREAD))
    approve(first, reviewer)
    assert app.invoke(Resume(resume="decided"), THREAD)["messages"][-1].text == "Closed 77."

    (second,) = paused_on(app.invoke({"messages": [HumanMessage("And 78.")]}, THREAD))
    assert second != first
    approve(second, reviewer)
    result = app.invoke(Resume(resume="decided"), THREAD)
    client.close()
    assert result["messages"][-1].text == "Closed 78."
    assert [m.status for m in tool_messages(result)] == ["success", "success"]
    assert crm.calls == [case("case_77"), case("case_78")]
    refs = set(Occurrence.objects.values_list("client_ref", flat=True))
    assert len(refs) == 2 and all("call_0" in ref for ref in refs)
    assert Command.objects.filter(state=Command.State.COMMITTED).count() == 2


def test_after_a_lost_checkpoint_a_rejected_action_is_answered_without_a_proposal(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D4: the thread's checkpoint is gone, the model asks again for the action a reviewer
    rejected. The gate asks the console for the thread's prior decisions before proposing:
    it answers with the earlier reason and leaves no orphan request in the inbox."""
    client, crm = ApprovalConsole(live_server.url, runtime.raw_key), Effects()
    replies = [ai_calls(("close_case", "call_0", case("case_77"))), AIMessage("Not closed.")]
    app = graph(InMemorySaver(), replies, gated_tool(client, "close_case", crm))
    (first,) = paused_on(app.invoke({"messages": [HumanMessage("Close 77.")]}, THREAD))
    reject(first, reviewer, "Case 77 has an open refund.")
    app.invoke(Resume(resume="decided"), THREAD)

    lost = [ai_calls(("close_case", "call_1", case("case_77"))), AIMessage("It stays open.")]
    again = graph(InMemorySaver(), lost, gated_tool(client, "close_case", crm))
    result = again.invoke({"messages": [HumanMessage("Close 77, please.")]}, THREAD)
    client.close()
    assert "__interrupt__" not in result
    (answer,) = tool_messages(result)
    assert answer.status == "error" and "already rejected" in answer.text
    assert "Case 77 has an open refund." in answer.text and ".." not in answer.text
    assert Occurrence.objects.count() == 1  # nothing proposed that nobody would decide
    assert crm.calls == []


class Blocking(Effects):
    """A CRM call that holds until released: the winner is still running the tool."""

    def __init__(self) -> None:
        super().__init__()
        self.running, self.release = threading.Event(), threading.Event()

    def __call__(self, arguments: Mapping[str, Any], idempotency_key: str) -> str:
        self.running.set()
        assert self.release.wait(30)
        return super().__call__(arguments, idempotency_key)


class Watched(ApprovalConsole):
    """A client that tells when it starts waiting and counts its effect reports."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting, self.reports = threading.Event(), 0
        self.hold_claim: tuple[threading.Event, threading.Event] | None = None

    def watch(self, *args: Any, **kwargs: Any) -> Any:
        self.waiting.set()
        return super().watch(*args, **kwargs)

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        if self.hold_claim is not None:
            picked, go = self.hold_claim
            picked.set()
            assert go.wait(30)
        return super().claim(*args, **kwargs)

    def report_effect(self, *args: Any, **kwargs: Any) -> Any:
        self.reports += 1
        return super().report_effect(*args, **kwargs)


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target())
        except BaseException as exc:  # the test asserts on it
            out.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def paused_thread(client: ApprovalConsole, crm: Effects) -> tuple[InMemorySaver, str]:
    saver = InMemorySaver()
    replies = [ai_calls(("close_case", "call_0", case("case_77")))]
    app = graph(saver, replies, gated_tool(client, "close_case", crm))
    (occurrence_id,) = paused_on(app.invoke({"messages": [HumanMessage("Close 77.")]}, THREAD))
    return saver, occurrence_id


def resumer(client: ApprovalConsole, saver: InMemorySaver, crm: Effects) -> Callable[[], Any]:
    """A process resuming the paused thread from its own copy of the checkpoint."""
    app = graph(
        copy.deepcopy(saver),
        [AIMessage("Done.")],
        gated_tool(client, "close_case", crm, effect_timeout=20),
    )
    return lambda: app.invoke(Resume(resume="decided"), THREAD)


def only_answer(out: list[Any]) -> ToolMessage:
    (result,) = out
    assert not isinstance(result, BaseException), result
    (answer,) = tool_messages(result)
    return answer


def test_a_second_process_resuming_the_same_execution_waits_for_the_first(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D5: two processes resume the same thread. The winner claimed and is still running
    the tool when the loser finds the claim: the loser waits for the winner's effect and
    tells the model that, instead of reporting outcome_unknown under the winner."""
    url, key = live_server.url, runtime.raw_key
    crm = Blocking()
    first, second = Watched(url, key, long_poll=True), Watched(url, key, long_poll=True)
    saver, occurrence_id = paused_thread(first, crm)
    approve(occurrence_id, reviewer)

    winner, won = in_thread(resumer(first, saver, crm))
    assert crm.running.wait(30)
    loser, lost = in_thread(resumer(second, saver, crm))
    assert second.waiting.wait(30)
    crm.release.set()
    winner.join(60)
    loser.join(60)
    first.close()
    second.close()

    assert only_answer(won).status == "success"
    late = only_answer(lost)
    assert late.status == "success" and "already executed" in late.text
    assert crm.calls == [case("case_77")]
    assert (first.reports, second.reports) == (1, 0)
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert command.state == Command.State.COMMITTED
    assert not [k for k in audit_kinds(occurrence_id) if "unknown" in k]


def test_a_process_whose_token_was_picked_up_again_waits_instead_of_raising_replayed(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D5: the first process picked the token up; before it claimed, a second process of
    the same execution picked it up again (voiding the first one's) and ran the tool. The
    first's claim is refused as replayed: it waits for the second's outcome and reports it,
    no uncaught Replayed, no second effect, no report of its own."""
    url, key = live_server.url, runtime.raw_key
    crm = Effects()
    first, second = Watched(url, key, long_poll=True), Watched(url, key, long_poll=True)
    saver, occurrence_id = paused_thread(first, crm)
    approve(occurrence_id, reviewer)
    picked, go = threading.Event(), threading.Event()
    first.hold_claim = (picked, go)

    slow, slow_out = in_thread(resumer(first, saver, crm))
    assert picked.wait(30)
    fast, fast_out = in_thread(resumer(second, saver, crm))
    fast.join(60)
    go.set()
    slow.join(60)
    first.close()
    second.close()

    assert only_answer(fast_out).status == "success"
    late = only_answer(slow_out)
    assert late.status == "success" and "already executed" in late.text
    assert crm.calls == [case("case_77")]
    assert (first.reports, second.reports) == (0, 1)
    kinds = audit_kinds(occurrence_id)
    assert kinds.count("claim.approved") == 1 and kinds.count("token.redelivered") == 1


def test_the_calls_of_one_model_message_are_proposed_at_once_and_awaited_together(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D7: two calls in one message reach the inbox together under one pause (not one
    review round after the other); nothing runs until both are decided, then both run."""
    client, crm = ApprovalConsole(live_server.url, runtime.raw_key), Effects()
    replies = [
        ai_calls(
            ("close_case", "call_0", case("case_77")), ("close_case", "call_1", case("case_78"))
        ),
        AIMessage("Both closed."),
    ]
    app = graph(InMemorySaver(), replies, gated_tool(client, "close_case", crm))
    both = paused_on(app.invoke({"messages": [HumanMessage("Close 77 and 78.")]}, THREAD))
    assert len(both) == 2
    statuses = Occurrence.objects.filter(pk__in=both).values_list("status", flat=True)
    assert sorted(statuses) == ["pending_review", "pending_review"]

    approve(both[0], reviewer)
    assert paused_on(app.invoke(Resume(resume="one"), THREAD)) == [both[1]]
    assert crm.calls == []  # the decided one waits for the other

    approve(both[1], reviewer)
    result = app.invoke(Resume(resume="both"), THREAD)
    client.close()
    assert "__interrupt__" not in result and result["messages"][-1].text == "Both closed."
    assert [m.status for m in tool_messages(result)] == ["success", "success"]
    assert [m.tool_call_id for m in tool_messages(result)] == ["call_0", "call_1"]
    assert crm.calls == [case("case_77"), case("case_78")]
    assert Occurrence.objects.count() == 2
