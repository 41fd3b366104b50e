"""``approval_console.langchain.ConsoleApprovalMiddleware`` with the real ``langchain``
package (``create_agent``), a fake chat model (no network) and a live console: the agent
LangChain's own ``HumanInTheLoopMiddleware`` example builds, with that one line changed.
Approve runs the tool once after the claim, with its idempotency key; an edit runs the
reviewer's arguments and says so; a rejection runs nothing and gives the model the reason;
a console-executed refund is reported as its effect; a crash after the approval is
recovered from the checkpointer without a second effect."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from approval_console import ApprovalConsole
from approval_console.langchain import ConsoleApprovalMiddleware, idempotency_key
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command as Resume
from pydantic import Field

from approvals.models import Command, Occurrence
from tests.clients.conftest import audit_kinds, edit, reject
from tests.clients.test_adapters_truth import ConsoleWorker, Watched, in_thread, only_answer
from tests.conftest import approve
from tests.demo.sandbox_fixture import ROOT, SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

THREAD = {"configurable": {"thread_id": "lc-thread-1"}}
CASE = {"case_id": "case_77"}
REFUND = {"payment_id": "pay_123", "amount_minor": 7700, "currency": "EUR", "reason": "Late"}
# What a HumanInTheLoopMiddleware program sends on resume: not used, the console decides.
HITL_RESUME: Resume[Any] = Resume(resume={"decisions": [{"type": "approve"}]})


class Crash(BaseException):
    """The process dies here (not an error any code would catch)."""


class FakeModel(GenericFakeChatModel):
    """Answers ``messages`` in order, and keeps what it was shown each time."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


class CRM:
    """The CRM close_case closes cases in: every real call, with the key it carried."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], str]] = []
        self.notes: list[str] = []
        self.crash = False

    def tools(self) -> list[Any]:
        @tool
        def close_case(case_id: str) -> str:
            """Close a support case."""
            self.calls.append(({"case_id": case_id}, idempotency_key()))
            if self.crash:
                raise Crash
            return f"{case_id} closed"

        @tool
        def issue_refund(payment_id: str, amount_minor: int, currency: str, reason: str) -> str:
            """Refund a payment (the console executes it)."""
            raise AssertionError("a console-executed tool never runs in the agent")

        @tool
        def add_note(case_id: str, text: str) -> str:
            """Add an internal note to a case (not gated)."""
            self.notes.append(text)
            return "noted"

        return [close_case, issue_refund, add_note]


def calls(*items: tuple[str, str, Mapping[str, Any]]) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": n, "args": dict(a), "id": i} for n, i, a in items]
    )


def agent(
    console: ApprovalConsole, saver: InMemorySaver, model: FakeModel, crm: CRM, **options: Any
) -> Any:
    """LangChain's HITL example with one line changed: the middleware."""
    return create_agent(
        model,
        tools=crm.tools(),
        middleware=[
            ConsoleApprovalMiddleware(
                console, interrupt_on={"close_case": True, "issue_refund": True}, **options
            )
        ],
        checkpointer=saver,
    )


def model(*replies: AIMessage) -> FakeModel:
    return FakeModel(messages=iter(replies))


def paused_on(result: Mapping[str, Any]) -> list[str]:
    """The occurrences the agent's interrupt waits for (HITLRequest-shaped)."""
    (pause,) = result["__interrupt__"]
    value = pause.value
    assert len(value["action_requests"]) == len(value["review_configs"])
    return [str(c["occurrence_id"]) for c in value["approval_console"]["calls"]]


def start(app: Any, text: str = "Close case 77, it is solved.") -> list[str]:
    return paused_on(app.invoke({"messages": [HumanMessage(text)]}, THREAD))


def tool_messages(result: Mapping[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def shown(fake: FakeModel) -> list[ToolMessage]:
    """The tool messages the model was shown on its last turn."""
    return [m for m in fake.seen[-1] if isinstance(m, ToolMessage)]


def test_approve_runs_the_tool_once_after_the_claim_with_its_key(
    console: ApprovalConsole, reviewer: Any
):
    saver, crm = InMemorySaver(), CRM()
    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Case 77 is closed."))
    app = agent(console, saver, fake, crm)
    (occurrence_id,) = start(app)
    assert crm.calls == [] and Command.objects.count() == 0
    approve(occurrence_id, reviewer)

    result = app.invoke(HITL_RESUME, THREAD)
    assert "__interrupt__" not in result
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert crm.calls == [(CASE, command.idempotency_key)]
    assert command.state == Command.State.COMMITTED
    assert audit_kinds(occurrence_id).count("claim.approved") == 1
    (answer,) = tool_messages(result)
    assert answer.status == "success" and answer.text == "case_77 closed"
    assert answer.response_metadata["approval_console"]["status"] == "executed"
    assert [m.text for m in shown(fake)] == ["case_77 closed"]
    assert result["messages"][-1].text == "Case 77 is closed."
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    assert occurrence.run_id == "lc-thread-1" and "call_0" in occurrence.client_ref


@pytest.mark.parametrize(
    ("fault", "status", "says", "refunds"),
    [
        (None, "success", "took effect", 1),
        # D1: the payments service declines the approved refund: no success for the model.
        ("declined", "error", "Nothing took effect", 0),
    ],
)
def test_approve_of_a_console_executed_refund_reports_its_effect(
    live_server: Any,
    runtime: Any,
    reviewer: Any,
    payments: SandboxProcess,
    fault: str | None,
    status: str,
    says: str,
    refunds: int,
):
    client = ConsoleWorker(live_server.url, runtime.raw_key, long_poll=True)
    saver, crm = InMemorySaver(), CRM()
    fake = model(calls(("issue_refund", "call_0", REFUND)), AIMessage("Told the user."))
    app = agent(client, saver, fake, crm, effect_timeout=20)
    (occurrence_id,) = start(app, "Refund my parcel.")
    approve(occurrence_id, reviewer)
    payments.fault(fault)

    result = app.invoke(HITL_RESUME, THREAD)
    for worker in client.threads:
        worker.join()
    client.close()
    (answer,) = tool_messages(result)
    assert answer.status == status and says in answer.text
    assert "Approved" not in answer.text
    assert len(payments.refunds()) == refunds
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert command.executed_by == "console"
    assert audit_kinds(occurrence_id).count("claim.approved") == 1
    assert says in shown(fake)[0].text


def test_edit_runs_the_reviewers_arguments_and_tells_the_model(
    console: ApprovalConsole, reviewer: Any, second_reviewer: Any
):
    saver, crm = InMemorySaver(), CRM()
    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Closed case 78."))
    app = agent(console, saver, fake, crm)
    (occurrence_id,) = start(app)
    edit(occurrence_id, reviewer, {"case_id": "case_78"})
    approve(occurrence_id, second_reviewer)

    result = app.invoke(HITL_RESUME, THREAD)
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert crm.calls == [({"case_id": "case_78"}, command.idempotency_key)]
    current = Occurrence.objects.get(pk=occurrence_id).proposals.get(is_current=True)
    assert command.action_digest == current.action_digest and current.version == 2
    (answer,) = tool_messages(result)
    assert answer.status == "success" and answer.text.endswith("case_78 closed")
    assert "A reviewer (rita) changed the arguments" in answer.text
    assert 'case_id from "case_77" to "case_78"' in answer.text
    assert "changed the arguments" in shown(fake)[0].text


def test_an_edited_console_executed_refund_is_told_to_the_model_as_it_ran(
    live_server: Any, runtime: Any, reviewer: Any, second_reviewer: Any, payments: SandboxProcess
):
    """D2 through the middleware: the reviewer cut the refund to 5,000; the model hears what
    changed and that this refund took effect."""
    client = ConsoleWorker(live_server.url, runtime.raw_key, long_poll=True)
    saver, crm = InMemorySaver(), CRM()
    fake = model(calls(("issue_refund", "call_0", REFUND)), AIMessage("Refunded EUR 50.00."))
    app = agent(client, saver, fake, crm, effect_timeout=20)
    (occurrence_id,) = start(app, "Refund my parcel.")
    edit(occurrence_id, reviewer, {**REFUND, "amount_minor": 5000})
    approve(occurrence_id, second_reviewer)

    result = app.invoke(HITL_RESUME, THREAD)
    for worker in client.threads:
        worker.join()
    client.close()
    (answer,) = tool_messages(result)
    assert answer.status == "success" and "took effect" in answer.text
    assert "amount_minor from 7700 to 5000" in answer.text
    assert answer.response_metadata["approval_console"]["edited_by"] == "rita"
    (refund,) = payments.refunds()
    assert refund["amount_minor"] == 5000


def test_reject_runs_nothing_and_the_model_sees_the_reason(console: ApprovalConsole, reviewer: Any):
    saver, crm = InMemorySaver(), CRM()
    # The model retries the rejected call under a new id, then gives up.
    fake = model(
        calls(("close_case", "call_0", CASE)),
        calls(("close_case", "call_1", CASE)),
        AIMessage("I will not close it."),
    )
    app = agent(console, saver, fake, crm)
    (occurrence_id,) = start(app)
    reject(occurrence_id, reviewer, "The customer is still waiting for a refund.")

    result = app.invoke(HITL_RESUME, THREAD)
    assert "__interrupt__" not in result
    assert crm.calls == [] and Command.objects.count() == 0
    first, second = tool_messages(result)
    assert first.status == "error" and second.status == "error"
    assert "The customer is still waiting for a refund." in first.text
    assert "already rejected" in second.text  # the retry was not proposed again
    assert Occurrence.objects.count() == 1
    assert "The customer is still waiting for a refund." in shown(fake)[-1].text
    assert result["messages"][-1].text == "I will not close it."


def test_after_a_lost_checkpoint_a_rejected_call_is_answered_without_a_proposal(
    console: ApprovalConsole, reviewer: Any
):
    """D4 through the middleware: the thread's checkpoints are gone and the model asks
    again for the rejected action; the earlier reason answers it, nothing is proposed."""
    crm = CRM()
    (occurrence_id,) = start(
        agent(console, InMemorySaver(), model(calls(("close_case", "call_0", CASE))), crm)
    )
    reject(occurrence_id, reviewer, "Case 77 has an open refund.")

    fake = model(calls(("close_case", "call_1", CASE)), AIMessage("It stays open."))
    result = agent(console, InMemorySaver(), fake, crm).invoke(
        {"messages": [HumanMessage("Close case 77, please.")]}, THREAD
    )
    assert "__interrupt__" not in result
    (answer,) = tool_messages(result)
    assert answer.status == "error" and "already rejected" in answer.text
    assert "Case 77 has an open refund." in answer.text and ".." not in answer.text
    assert Occurrence.objects.count() == 1 and crm.calls == []


def test_a_call_id_reused_in_a_later_turn_for_another_case_is_a_new_request(
    console: ApprovalConsole, reviewer: Any
):
    """D6 through the middleware: ``call_0`` again in the next turn, for case 78, is a
    new request (no ClientRefConflict), and each case is closed once."""
    saver, crm = InMemorySaver(), CRM()
    fake = model(
        calls(("close_case", "call_0", CASE)),
        AIMessage("Closed 77."),
        calls(("close_case", "call_0", {"case_id": "case_78"})),
        AIMessage("Closed 78."),
    )
    app = agent(console, saver, fake, crm)
    (first,) = start(app)
    approve(first, reviewer)
    assert app.invoke(HITL_RESUME, THREAD)["messages"][-1].text == "Closed 77."
    (second,) = start(app, "And case 78.")
    assert second != first
    approve(second, reviewer)
    result = app.invoke(HITL_RESUME, THREAD)
    assert result["messages"][-1].text == "Closed 78."
    assert [arguments for arguments, _ in crm.calls] == [CASE, {"case_id": "case_78"}]
    assert Command.objects.filter(state=Command.State.COMMITTED).count() == 2


class SlowCRM(CRM):
    """close_case holds until released: the first process is still running it."""

    def __init__(self) -> None:
        super().__init__()
        self.running, self.release = threading.Event(), threading.Event()

    def tools(self) -> list[Any]:
        @tool
        def close_case(case_id: str) -> str:
            """Close a support case."""
            self.running.set()
            assert self.release.wait(30)
            self.calls.append(({"case_id": case_id}, idempotency_key()))
            return f"{case_id} closed"

        return [close_case, *super().tools()[1:]]


def test_a_second_process_resuming_the_thread_waits_for_the_first(
    live_server: Any, runtime: Any, reviewer: Any
):
    """D5 through the middleware: two processes resume the same thread from its
    checkpoints; the first claimed and is still running the tool when the second finds the
    claim. The second waits for the first's effect and tells the model that: no second
    run, no report of its own, no outcome_unknown in the audit."""
    url, key, crm = live_server.url, runtime.raw_key, SlowCRM()
    first, second = Watched(url, key, long_poll=True), Watched(url, key, long_poll=True)
    saver = InMemorySaver()
    (occurrence_id,) = start(agent(first, saver, model(calls(("close_case", "call_0", CASE))), crm))
    approve(occurrence_id, reviewer)

    def resumer(client: ApprovalConsole) -> Any:
        app = agent(client, copy.deepcopy(saver), model(AIMessage("Done.")), crm, effect_timeout=20)
        return lambda: app.invoke(HITL_RESUME, THREAD)

    winner, won = in_thread(resumer(first))
    assert crm.running.wait(30)
    loser, lost = in_thread(resumer(second))
    assert second.waiting.wait(30)
    crm.release.set()
    winner.join(60)
    loser.join(60)
    first.close()
    second.close()

    assert only_answer(won).status == "success"
    late = only_answer(lost)
    assert late.status == "success" and "already executed" in late.text
    assert len(crm.calls) == 1
    assert (first.reports, second.reports) == (1, 0)
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert command.state == Command.State.COMMITTED
    assert not [k for k in audit_kinds(occurrence_id) if "unknown" in k]


def test_calls_of_one_message_are_proposed_together_and_decided_separately(
    console: ApprovalConsole, reviewer: Any
):
    saver, crm = InMemorySaver(), CRM()
    fake = model(
        calls(
            ("close_case", "call_0", CASE),
            ("close_case", "call_1", {"case_id": "case_78"}),
        ),
        AIMessage("Closed 77, not 78."),
    )
    app = agent(console, saver, fake, crm)
    first, second = start(app)  # one pause for both, both in the inbox
    approve(first, reviewer)
    assert "__interrupt__" in app.invoke(HITL_RESUME, THREAD)  # the second is still open
    reject(second, reviewer, "Case 78 is not solved")

    result = app.invoke(HITL_RESUME, THREAD)
    assert [arguments for arguments, _ in crm.calls] == [CASE]
    closed, refused = tool_messages(result)
    assert closed.status == "success" and refused.status == "error"
    assert "Case 78 is not solved." in refused.text


def test_per_call_mode_pauses_once_per_call_and_runs_it_after_the_claim(
    console: ApprovalConsole, reviewer: Any
):
    """``interrupt_mode="per_call"`` as LangChain has it: a ``ToolApprovalRequest`` per
    call, answered by interrupt id (the answer is not used: the console decides)."""
    saver, crm = InMemorySaver(), CRM()
    fake = model(calls(("close_case", "call_0", CASE)), AIMessage("Closed."))
    app = agent(console, saver, fake, crm, interrupt_mode="per_call")
    started = app.invoke({"messages": [HumanMessage("Close case 77.")]}, THREAD)
    (pause,) = started["__interrupt__"]
    assert pause.value["type"] == "tool_approval" and pause.value["tool_call_id"] == "call_0"
    (info,) = pause.value["approval_console"]["calls"]
    assert crm.calls == []
    approve(info["occurrence_id"], reviewer)

    result = app.invoke(Resume(resume={pause.id: {"type": "reject"}}), THREAD)
    (command,) = Command.objects.filter(occurrence_id=info["occurrence_id"])
    assert crm.calls == [(CASE, command.idempotency_key)]
    (answer,) = tool_messages(result)
    assert answer.status == "success" and answer.text == "case_77 closed"


def test_a_tool_not_in_interrupt_on_is_not_proposed(console: ApprovalConsole, reviewer: Any):
    saver, crm = InMemorySaver(), CRM()
    note = {"case_id": "case_77", "text": "Solved on the phone."}
    fake = model(
        calls(("add_note", "call_0", note), ("close_case", "call_1", CASE)),
        AIMessage("Noted and closed."),
    )
    app = agent(console, saver, fake, crm)
    (occurrence_id,) = start(app)  # only close_case reaches the inbox
    approve(occurrence_id, reviewer)

    result = app.invoke(HITL_RESUME, THREAD)
    assert crm.notes == ["Solved on the phone."] and len(crm.calls) == 1
    noted, closed = tool_messages(result)
    assert noted.text == "noted" and "approval_console" not in noted.response_metadata
    assert closed.text == "case_77 closed"
    assert Occurrence.objects.count() == 1


class ClaimCrashes(ApprovalConsole):
    """Dies after the token was picked up, before the claim is sent."""

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        raise Crash


class DiesAfterReporting(ApprovalConsole):
    """Dies after the effect was reported, before the agent could checkpoint the tools."""

    def report_effect(self, *args: Any, **kwargs: Any) -> Any:
        super().report_effect(*args, **kwargs)
        raise Crash


@pytest.mark.parametrize("dies", [ClaimCrashes, DiesAfterReporting])
def test_a_crash_after_the_approval_is_resumed_with_exactly_one_effect(
    reviewer: Any, console_factory: Any, dies: type[ApprovalConsole]
):
    saver, crm = InMemorySaver(), CRM()
    first = console_factory(dies)
    (occurrence_id,) = start(agent(first, saver, model(calls(("close_case", "call_0", CASE))), crm))
    approve(occurrence_id, reviewer)
    with pytest.raises(Crash):
        agent(first, saver, model(), crm).invoke(HITL_RESUME, THREAD)

    # A new process: a new client and agent on the same checkpointer, resuming the thread.
    restarted = agent(console_factory(), saver, model(AIMessage("Closed.")), crm, effect_timeout=1)
    result = restarted.invoke(None, THREAD)
    (answer,) = tool_messages(result)
    assert answer.status == "success"
    assert len(crm.calls) == 1
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert command.state == Command.State.COMMITTED
    assert crm.calls[0][1] == command.idempotency_key
    kinds = audit_kinds(occurrence_id)
    assert kinds.count("claim.approved") == 1
    assert kinds.count("token.redelivered") == (1 if dies is ClaimCrashes else 0)


def test_a_crash_in_the_tool_after_the_claim_goes_to_an_operator(
    console: ApprovalConsole, reviewer: Any, console_factory: Any
):
    """close_case is ``unsafe``: a process that died while running it cannot tell whether
    it took effect, so the resumed one does not run it again: outcome unknown."""
    saver, crm = InMemorySaver(), CRM()
    (occurrence_id,) = start(
        agent(console, saver, model(calls(("close_case", "call_0", CASE))), crm)
    )
    approve(occurrence_id, reviewer)
    crm.crash = True
    with pytest.raises(Crash):
        agent(console, saver, model(), crm).invoke(HITL_RESUME, THREAD)
    crm.crash = False

    fake = model(AIMessage("I could not confirm it."))
    restarted = agent(console_factory(), saver, fake, crm, effect_timeout=1)
    result = restarted.invoke(None, THREAD)
    (answer,) = tool_messages(result)
    assert answer.status == "error" and "unknown" in answer.text
    assert len(crm.calls) == 1
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert command.state == Command.State.OUTCOME_UNKNOWN


def run_agent(url: str, key: str, folder: Path, step: str, kill: str = "") -> Any:
    """One agent process (tests/clients/langchain_agent_process.py), to its end or its
    SIGKILL."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "clients/python/src")]),
    }
    command = [sys.executable, "-m", "tests.clients.langchain_agent_process"]
    return subprocess.run(
        [*command, url, key, str(folder), step, kill],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def effects_in(folder: Path) -> list[dict[str, str]]:
    path = folder / "effects.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill", "runs", "status", "state"),
    [
        # Killed after the pickup, before the claim: the token is re-delivered to the same
        # execution, claimed, and the tool runs once.
        ("before_claim", 1, "success", Command.State.COMMITTED),
        # Killed after the claim, before the tool: close_case is unsafe, so the restarted
        # process cannot tell whether it ran and does not run it: an operator decides.
        ("after_claim", 0, "error", Command.State.OUTCOME_UNKNOWN),
    ],
)
def test_a_process_killed_after_the_approval_resumes_from_its_checkpoints(
    live_server: Any,
    runtime: Any,
    reviewer: Any,
    tmp_path: Path,
    kill: str,
    runs: int,
    status: str,
    state: str,
):
    """Real processes and a real SIGKILL: the agent pauses, is approved, dies in the
    middleware, and a new process resumes the thread from the checkpoints it left."""
    started = run_agent(live_server.url, runtime.raw_key, tmp_path, "start")
    assert started.returncode == 0, started.stderr
    (occurrence_id,) = json.loads(started.stdout.splitlines()[-1])
    approve(occurrence_id, reviewer)

    killed = run_agent(live_server.url, runtime.raw_key, tmp_path, "resume", kill)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert effects_in(tmp_path) == []

    restarted = run_agent(live_server.url, runtime.raw_key, tmp_path, "restart")
    assert restarted.returncode == 0, restarted.stderr
    answer = json.loads(restarted.stdout.splitlines()[-1])
    assert answer["status"] == status
    (command,) = Command.objects.filter(occurrence_id=occurrence_id)
    assert command.state == state
    assert effects_in(tmp_path) == [{**CASE, "key": command.idempotency_key}] * runs
    kinds = audit_kinds(occurrence_id)
    assert kinds.count("claim.approved") == 1
    assert kinds.count("token.redelivered") == (1 if kill == "before_claim" else 0)
    assert Occurrence.objects.count() == 1


def test_outside_a_console_approved_call_there_is_no_idempotency_key():
    with pytest.raises(LookupError):
        idempotency_key()


def test_when_is_refused_rather_than_ignored(console: ApprovalConsole):
    with pytest.raises(ValueError, match="when"):
        ConsoleApprovalMiddleware(
            console,
            interrupt_on={"close_case": {"allowed_decisions": ["approve"], "when": bool}},
        )
