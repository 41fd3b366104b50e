"""``ConsoleApprovalMiddleware`` in the places LangChain's ``HumanInTheLoopMiddleware`` is
used: agents run with ``ainvoke`` (async hooks), a tool's ``allowed_decisions``,
``description`` and ``edit_notice``, and ``respond``, which the console does not offer and
the middleware refuses. The real ``langchain`` package, fake models and a live console."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from approval_console import ApprovalConsole, AsyncApprovalConsole
from approval_console.langchain import ConsoleApprovalMiddleware, idempotency_key
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command as Resume
from langgraph.types import Command as Update

from approvals.models import Command, Occurrence
from tests.clients.conftest import audit_kinds, edit, reject, run_async
from tests.clients.test_adapters_truth import ConsoleWorker
from tests.clients.test_langchain_middleware import (
    CASE,
    CRM,
    HITL_RESUME,
    REFUND,
    THREAD,
    ClaimCrashes,
    Crash,
    DiesAfterReporting,
    FakeModel,
    calls,
    model,
    paused_on,
    shown,
    start,
    tool_messages,
)
from tests.conftest import approve
from tests.demo.sandbox_fixture import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

NEW_CASE = {"case_id": "case_78"}


def agent(
    console: ApprovalConsole,
    fake: FakeModel,
    tools: list[Any],
    interrupt_on: Mapping[str, Any],
    saver: InMemorySaver | None = None,
    **options: Any,
) -> Any:
    return create_agent(
        fake,
        tools=tools,
        middleware=[ConsoleApprovalMiddleware(console, interrupt_on=interrupt_on, **options)],
        checkpointer=saver or InMemorySaver(),
    )


# -- async agents ---------------------------------------------------------------------------


class AsyncCRM:
    """close_case as a coroutine tool: every real call, with the key it carried."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], str]] = []

    def tools(self) -> list[Any]:
        @tool
        async def close_case(case_id: str) -> str:
            """Close a support case."""
            await asyncio.sleep(0)
            self.calls.append(({"case_id": case_id}, idempotency_key()))
            return f"{case_id} closed"

        @tool
        async def issue_refund(
            payment_id: str, amount_minor: int, currency: str, reason: str
        ) -> str:
            """Refund a payment (the console executes it)."""
            raise AssertionError("a console-executed tool never runs in the agent")

        return [close_case, issue_refund]


GATED = {"close_case": True, "issue_refund": True}


def ainvoke(app: Any, value: Any) -> Any:
    """``await app.ainvoke(value, THREAD)`` on an event loop of its own thread."""
    return run_async(app.ainvoke(value, THREAD))


def paused_async(result: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(interrupt id, occurrence id) of each pause, batched or per call."""
    return [
        (p.id, str(c["occurrence_id"]))
        for p in result["__interrupt__"]
        for c in p.value["approval_console"]["calls"]
    ]


@pytest.mark.parametrize("mode", ["batched", "per_call"])
def test_an_async_agent_runs_the_approved_call_once_with_its_key(
    console: ApprovalConsole, reviewer: Any, mode: str
):
    """(a) ``create_agent`` run with ``ainvoke`` and a coroutine tool: the async hooks
    propose and pause as the sync ones do, and the tool runs on the loop, once, after the
    claim, with the command's idempotency key."""
    crm = AsyncCRM()
    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Case 77 is closed."))
    app = agent(console, fake, crm.tools(), GATED, interrupt_mode=mode)
    started = ainvoke(app, {"messages": [HumanMessage("Close case 77.")]})
    ((interrupt_id, occurrence_id),) = paused_async(started)
    assert crm.calls == [] and not Command.objects.exists()
    assert Occurrence.objects.get(pk=occurrence_id).status == "pending_review"

    # Resumed before the decision: it pauses again, and nothing runs.
    resume = (
        HITL_RESUME if mode == "batched" else Resume(resume={interrupt_id: {"type": "approve"}})
    )
    assert "__interrupt__" in ainvoke(app, resume)
    assert crm.calls == []

    approve(occurrence_id, reviewer)
    result = ainvoke(app, HITL_RESUME if mode == "batched" else Resume(resume="decided"))
    assert "__interrupt__" not in result
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert crm.calls == [(CASE, command.idempotency_key)]
    assert command.state == Command.State.COMMITTED
    (answer,) = tool_messages(result)
    assert answer.status == "success" and answer.text == "case_77 closed"
    assert result["messages"][-1].text == "Case 77 is closed."


def test_an_async_agent_streamed_with_astream_pauses_and_runs_once(
    console: ApprovalConsole, reviewer: Any
):
    """``astream`` as ``ainvoke``: the stream ends at the pause (an ``__interrupt__``
    update) and, resumed after the decision, streams the tool's result, run once."""
    crm = AsyncCRM()
    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Case 77 is closed."))
    app = agent(console, fake, crm.tools(), GATED)

    async def stream(value: Any) -> list[dict[str, Any]]:
        return [chunk async for chunk in app.astream(value, THREAD, stream_mode="updates")]

    paused = run_async(stream({"messages": [HumanMessage("Close case 77.")]}))
    (pause,) = [c["__interrupt__"] for c in paused if "__interrupt__" in c]
    (call,) = pause[0].value["approval_console"]["calls"]
    approve(call["occurrence_id"], reviewer)

    updates = run_async(stream(HITL_RESUME))
    told = [
        m
        for update in updates
        for node in update.values()
        if isinstance(node, dict)
        for m in node.get("messages", [])
        if isinstance(m, ToolMessage)
    ]
    assert [m.text for m in told] == ["case_77 closed"]
    (command,) = Command.objects.all()
    assert crm.calls == [(CASE, command.idempotency_key)]


def test_an_async_agent_tells_the_model_the_edit_and_the_rejection(
    console: ApprovalConsole, reviewer: Any, second_reviewer: Any
):
    """(a) and (c) under ``ainvoke``: of one message's two calls, the edited one runs
    with the reviewer's arguments and its message says so; the rejected one runs nothing
    and carries the reason."""
    crm = AsyncCRM()
    fake = model(
        calls(("close_case", "call_0", CASE), ("close_case", "call_1", {"case_id": "case_79"})),
        AIMessage("Closed 78, not 79."),
    )
    app = agent(console, fake, crm.tools(), GATED)
    first, second = (o for _, o in paused_async(ainvoke(app, {"messages": [HumanMessage("Go")]})))
    edit(first, reviewer, NEW_CASE)
    approve(first, second_reviewer)
    reject(second, reviewer, "Case 79 is still open..")

    result = ainvoke(app, HITL_RESUME)
    (command,) = Command.objects.all()
    assert crm.calls == [(NEW_CASE, command.idempotency_key)]
    edited, rejected = tool_messages(result)
    assert edited.status == "success" and edited.text.endswith("case_78 closed")
    assert "A reviewer (rita) changed the arguments" in edited.text
    assert 'case_id from "case_77" to "case_78"' in edited.text
    assert rejected.status == "error" and "Case 79 is still open." in rejected.text
    assert ".." not in rejected.text
    assert [m.text for m in shown(fake)] == [edited.text, rejected.text]


def test_an_async_agent_waits_for_a_console_effect_without_blocking_its_loop(
    live_server: Any, runtime: Any, reviewer: Any, payments: SandboxProcess
):
    """(a) The console executes the refund a moment after the claim; while the
    middleware waits for the effect, the agent's event loop keeps running (the waits are in
    a worker thread), and the model hears the refund took effect."""
    client = ConsoleWorker(live_server.url, runtime.raw_key, long_poll=True)
    fake = model(calls(("issue_refund", "call_0", REFUND)), AIMessage("Refunded."))
    app = agent(client, fake, AsyncCRM().tools(), GATED, effect_timeout=20)
    ((_, occurrence_id),) = paused_async(
        ainvoke(app, {"messages": [HumanMessage("Refund my parcel.")]})
    )
    approve(occurrence_id, reviewer)

    async def resume_while_ticking() -> tuple[Any, int]:
        ticks = 0
        done = asyncio.Event()

        async def tick() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        try:
            return await app.ainvoke(HITL_RESUME, THREAD), ticks
        finally:
            done.set()
            await ticker

    result, ticks = run_async(resume_while_ticking())
    for worker in client.threads:
        worker.join()
    client.close()
    (answer,) = tool_messages(result)
    assert answer.status == "success" and "took effect" in answer.text
    assert len(payments.refunds()) == 1
    assert ticks >= 5  # the loop ran while the claim's effect was awaited (>= 0.5 s)


def test_many_calls_of_a_sync_tool_in_one_async_turn_all_run(
    console: ApprovalConsole, reviewer: Any
):
    """More gated calls of a plain (sync) tool in one message than the event loop's default
    executor has threads (LangChain runs sync tools there under ``ainvoke``): the
    middleware's own waits do not hold those threads, so every tool gets one to run in."""
    crm, count = CRM(), 12
    cases = [{"case_id": f"case_{n}"} for n in range(count)]
    fake = model(
        calls(*(("close_case", f"call_{n}", c) for n, c in enumerate(cases))), AIMessage("All.")
    )
    app = agent(console, fake, crm.tools(), GATED)
    pauses = paused_async(ainvoke(app, {"messages": [HumanMessage("Close them all.")]}))
    assert len(pauses) == count
    for _, occurrence_id in pauses:
        approve(occurrence_id, reviewer)

    # In a daemon thread joined with a timeout: were the executor's threads held, the
    # loop would never finish (nor could asyncio.run shut it down), and the test must fail,
    # not hang.
    out: list[Any] = []
    resumed = threading.Thread(
        target=lambda: out.append(asyncio.run(app.ainvoke(HITL_RESUME, THREAD))), daemon=True
    )
    resumed.start()
    resumed.join(240)
    assert not resumed.is_alive(), "the agent deadlocked on the loop's default executor"
    (result,) = out
    assert sorted(a["case_id"] for a, _ in crm.calls) == sorted(c["case_id"] for c in cases)
    assert [m.status for m in tool_messages(result)] == ["success"] * count
    assert Command.objects.filter(state=Command.State.COMMITTED).count() == count


@pytest.mark.parametrize("dies", [ClaimCrashes, DiesAfterReporting])
def test_an_async_agent_that_died_after_the_approval_resumes_with_one_effect(
    reviewer: Any, console_factory: Any, dies: type[ApprovalConsole]
):
    """Crash recovery under ``ainvoke`` as under ``invoke``: died before the claim (the
    token is re-delivered to the same execution) or after the effect was reported (it is
    not run again); a new agent on the same checkpointer resumes with ``ainvoke(None)``."""
    saver, crm = InMemorySaver(), AsyncCRM()
    first = console_factory(dies)
    app = agent(first, model(calls(("close_case", "call_0", CASE))), crm.tools(), GATED, saver)
    ((_, occurrence_id),) = paused_async(ainvoke(app, {"messages": [HumanMessage("Close.")]}))
    approve(occurrence_id, reviewer)
    with pytest.raises(Crash):
        ainvoke(agent(first, model(), crm.tools(), GATED, saver), HITL_RESUME)

    fake = model(AIMessage("Closed."))
    restarted = agent(console_factory(), fake, crm.tools(), GATED, saver, effect_timeout=1)
    result = ainvoke(restarted, None)
    (answer,) = tool_messages(result)
    assert answer.status == "success"
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert crm.calls == [(CASE, command.idempotency_key)]
    assert command.state == Command.State.COMMITTED
    kinds = audit_kinds(occurrence_id)
    assert kinds.count("claim.approved") == 1
    assert kinds.count("token.redelivered") == (1 if dies is ClaimCrashes else 0)


# -- allowed_decisions ----------------------------------------------------------------------

APPROVE_OR_REJECT = {"close_case": {"allowed_decisions": ["approve", "reject"]}}
EDIT_OR_REJECT = {"close_case": {"allowed_decisions": ["edit", "reject"]}}


def test_an_edit_of_a_tool_that_takes_no_edits_runs_nothing_and_is_told(
    console: ApprovalConsole, reviewer: Any, second_reviewer: Any
):
    """(b) ``allowed_decisions=["approve", "reject"]``: the reviewer reads that edits are
    not accepted; an edited approval is never picked up or claimed, and the model hears
    what the reviewer changed and that nothing ran."""
    crm = CRM()
    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Not closed."))
    app = agent(console, fake, crm.tools(), APPROVE_OR_REJECT)
    (occurrence_id,) = start(app)
    reason = Occurrence.objects.get(pk=occurrence_id).reason
    assert "does not accept edits" in reason
    edit(occurrence_id, reviewer, NEW_CASE)
    approve(occurrence_id, second_reviewer)

    result = app.invoke(HITL_RESUME, THREAD)
    assert crm.calls == [] and not Command.objects.exists()
    assert Occurrence.objects.get(pk=occurrence_id).status == "approved"  # never picked up
    (answer,) = tool_messages(result)
    assert answer.status == "error"
    assert 'case_id from "case_77" to "case_78"' in answer.text
    assert "does not accept edited calls of close_case, so nothing was run" in answer.text
    assert answer.response_metadata["approval_console"]["status"] == "refused"
    assert result["messages"][-1].text == "Not closed."


def test_an_unchanged_approval_runs_where_edits_are_not_taken(
    console: ApprovalConsole, reviewer: Any
):
    """The other half of the check: the model's own call, approved as proposed, is the
    same action (digest) and runs."""
    crm = CRM()
    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Closed."))
    app = agent(console, fake, crm.tools(), APPROVE_OR_REJECT)
    (occurrence_id,) = start(app)
    approve(occurrence_id, reviewer)
    result = app.invoke(HITL_RESUME, THREAD)
    (command,) = Command.objects.all()
    assert crm.calls == [(CASE, command.idempotency_key)]
    (answer,) = tool_messages(result)
    assert answer.status == "success" and answer.text == "case_77 closed"


@pytest.mark.parametrize("edited", [False, True])
def test_a_tool_that_runs_only_after_an_edit(
    console: ApprovalConsole, reviewer: Any, second_reviewer: Any, edited: bool
):
    """``allowed_decisions=["edit", "reject"]``: approved as proposed it does not run;
    approved after an edit it runs the reviewer's arguments."""
    crm = CRM()
    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Done."))
    app = agent(console, fake, crm.tools(), EDIT_OR_REJECT)
    (occurrence_id,) = start(app)
    assert "edit it or reject it" in Occurrence.objects.get(pk=occurrence_id).reason
    if edited:
        edit(occurrence_id, reviewer, NEW_CASE)
    approve(occurrence_id, second_reviewer)

    (answer,) = tool_messages(app.invoke(HITL_RESUME, THREAD))
    if edited:
        (command,) = Command.objects.all()
        assert crm.calls == [(NEW_CASE, command.idempotency_key)]
        assert answer.status == "success" and "changed the arguments" in answer.text
    else:
        assert crm.calls == [] and not Command.objects.exists()
        assert answer.status == "error" and "only after a reviewer's edit" in answer.text


@pytest.mark.parametrize(
    ("config", "says"),
    [
        # respond: a reviewer answering for the tool; the console has no such decision.
        ({"allowed_decisions": ["approve", "reject", "respond"]}, "'respond' is not offered"),
        ({"allowed_decisions": ["respond"]}, "'respond' is not offered"),
        ({"allowed_decisions": []}, "non-empty list"),
        ({"description": "Close it?"}, "non-empty list"),
        ({"allowed_decisions": ["approve", "ignore"]}, "unknown decisions"),
        ({"allowed_decisions": ["reject"]}, "could never run"),
        ({"allowed_decisions": ["approve"], "when": bool}, "'when' is not supported"),
    ],
)
def test_a_config_the_console_cannot_honour_is_refused(
    console: ApprovalConsole, config: dict[str, Any], says: str
):
    interrupt_on: dict[str, Any] = {"close_case": config}
    with pytest.raises(ValueError, match=says):
        ConsoleApprovalMiddleware(console, interrupt_on=interrupt_on)


def test_true_offers_the_consoles_three_decisions(console: ApprovalConsole):
    """``True`` is approve, edit and reject (LangChain's also has respond, not offered)."""
    crm = CRM()
    app = agent(console, model(calls(("close_case", "call_0", CASE))), crm.tools(), GATED)
    result = app.invoke({"messages": [HumanMessage("Close case 77.")]}, THREAD)
    (config,) = result["__interrupt__"][0].value["review_configs"]
    assert config == {
        "action_name": "close_case",
        "allowed_decisions": ["approve", "edit", "reject"],
    }


def test_the_async_client_is_refused_with_a_clear_error(live_server: Any, runtime: Any):
    client = AsyncApprovalConsole(live_server.url, runtime.raw_key)
    with pytest.raises(TypeError, match="takes an ApprovalConsole"):
        ConsoleApprovalMiddleware(client, interrupt_on=GATED)  # type: ignore[arg-type]
    run_async(client.aclose())


# -- description and edit_notice ------------------------------------------------------------


def describe(call: Any, state: Any, runtime: Any) -> str:
    assert runtime is not None
    return f"Close {call['args']['case_id']} ({len(state['messages'])} messages so far)"


@pytest.mark.parametrize(
    ("description", "reason"),
    [
        ("Close it for the customer?", "Close it for the customer?"),
        (describe, "Close case_77 (2 messages so far)"),
        (None, "Check this\n\nTool: close_case\nArgs: {'case_id': 'case_77'}"),
    ],
)
def test_the_description_is_what_the_reviewer_reads(
    console: ApprovalConsole, description: Any, reason: str
):
    """(b) A string, a function of (call, state, runtime), or LangChain's default made of
    ``description_prefix``, the tool and its arguments: the proposal's reason, and the
    ``action_requests``' description."""
    config: dict[str, Any] = {"allowed_decisions": ["approve", "edit", "reject"]}
    if description is not None:
        config["description"] = description
    fake = model(calls(("close_case", "call_0", CASE)))
    app = agent(
        console, fake, CRM().tools(), {"close_case": config}, description_prefix="Check this"
    )
    result = app.invoke({"messages": [HumanMessage("Close case 77.")]}, THREAD)
    (occurrence_id,) = paused_on(result)
    assert Occurrence.objects.get(pk=occurrence_id).reason == reason
    (request,) = result["__interrupt__"][0].value["action_requests"]
    assert request["description"] == reason


@pytest.mark.parametrize(
    ("notice", "expected"),
    [
        ("Do not re-issue your original call.", "Do not re-issue your original call."),
        (None, None),
    ],
)
def test_edit_notice_ends_the_note_or_removes_it(
    console: ApprovalConsole,
    reviewer: Any,
    second_reviewer: Any,
    notice: str | None,
    expected: str | None,
):
    """(c) As LangChain's ``edit_notice``: a string ends the note (which still names who
    changed what), ``None`` leaves the tool's result alone."""
    crm = CRM()
    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Closed 78."))
    app = agent(console, fake, crm.tools(), GATED, edit_notice=notice)
    (occurrence_id,) = start(app)
    edit(occurrence_id, reviewer, NEW_CASE)
    approve(occurrence_id, second_reviewer)
    (answer,) = tool_messages(app.invoke(HITL_RESUME, THREAD))
    if expected is None:
        assert answer.text == "case_78 closed"
    else:
        assert answer.text == (
            "A reviewer (rita) changed the arguments you proposed before approving: case_id "
            f'from "case_77" to "case_78". {expected}\n\nTool response:\ncase_78 closed'
        )


def test_the_edit_note_reaches_a_tool_that_answers_with_a_command(
    console: ApprovalConsole, reviewer: Any, second_reviewer: Any
):
    """A tool returning a ``Command`` carries its message in the update: the note is put
    there, as LangChain's middleware does."""
    ran: list[str] = []

    @tool
    def close_case(case_id: str) -> Update[Any]:
        """Close a support case."""
        ran.append(case_id)
        return Update(
            update={
                "messages": [
                    ToolMessage(f"{case_id} closed", tool_call_id="call_0", name="close_case")
                ]
            }
        )

    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Closed 78."))
    app = agent(console, fake, [close_case], {"close_case": True})
    (occurrence_id,) = start(app)
    edit(occurrence_id, reviewer, NEW_CASE)
    approve(occurrence_id, second_reviewer)
    (answer,) = tool_messages(app.invoke(HITL_RESUME, THREAD))
    assert ran == ["case_78"]
    assert 'case_id from "case_77" to "case_78"' in answer.text
    assert answer.text.endswith("Tool response:\ncase_78 closed")
    assert answer.response_metadata["approval_console"]["status"] == "executed"
