"""LangGraph adapter: gate a tool node's calls behind the approval console.

::

    from approval_console import ApprovalConsole
    from approval_console.langgraph import gated_tool, tool_node

    console = ApprovalConsole("http://127.0.0.1:8000", key)
    close_case = gated_tool(console, "close_case", lambda args, key: crm.close(**args, key=key))
    graph.add_node("tools", tool_node(close_case))   # with a checkpointer, and a thread_id

For each tool call the gate proposes the call with ``run_id`` = the thread id and a
``client_ref`` from the tool-call id and the action's digest (re-running the node proposes
nothing new; a model reusing ``call_0`` for another action makes a new request), pauses the
graph with ``interrupt()`` while a person reviews, and after ``Command(resume=...)`` (any
value: the console's decision is what counts) picks up the token for an execution id
derived from thread, tool call, action and attempt (so a restarted process gets the token again),
claims what the reviewer approved, runs the tool once and reports its effect. Nothing in
the checkpointer holds a token: the interrupt's value and the ``ToolMessage``'s artifact
name the occurrence only. A rejection becomes a ``ToolMessage`` with the reason. Before
proposing, the gate asks ``POST /actions/canonicalize`` with the thread id for the thread's
earlier rejections of the same action: a model retrying a rejected call (or a thread whose
checkpoint was lost) is answered with the earlier reason, and nothing is proposed that
nobody would decide. All tool calls of one model message are proposed at once and the node
pauses once for all of them: they reach the inbox together and run after the last decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from langchain_core.messages import AnyMessage, ToolCall, ToolMessage
from langgraph.config import get_config
from langgraph.types import interrupt

from approval_console.client import ApprovalConsole
from approval_console.execution import client_ref_for, execution_id_for
from approval_console.gate import (
    DEFAULT_EFFECT_TIMEOUT,
    EDIT_NOTICE,
    Execute,
    Outcome,
    run_decided,
    sentence,
)
from approval_console.models import Occurrence

ARTIFACT_KEY = "approval_console"


def _thread_id() -> str:
    configurable = get_config().get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if not thread_id:
        raise RuntimeError("gated tools need a checkpointer and a thread_id in the config")
    return str(thread_id)


@dataclass
class _Prepared:
    """A tool call of the node: proposed (``occurrence_id``), or answered without a
    proposal (``answer``)."""

    call: ToolCall
    digest: str
    execution_id: str
    occurrence_id: str = ""
    answer: ToolMessage | None = None


class GatedTool:
    """One tool of a tool node whose every call needs the console's approval."""

    def __init__(
        self,
        client: ApprovalConsole,
        tool: str,
        execute: Execute,
        *,
        reason: Callable[[ToolCall], str] | None = None,
        requested_by: str | None = None,
        attempt: int = 1,
        renew_expired: bool = True,
        effect_timeout: float = DEFAULT_EFFECT_TIMEOUT,
        edit_notice: str | None = EDIT_NOTICE,
    ) -> None:
        self.client = client
        self.edit_notice = edit_notice
        self.tool = tool
        self.execute = execute
        self.reason = reason or (lambda call: f"The agent called {call['name']}.")
        self.requested_by = requested_by
        self.attempt = attempt
        self.renew_expired = renew_expired
        self.effect_timeout = effect_timeout

    @property
    def name(self) -> str:
        return self.tool

    def __call__(self, call: ToolCall, messages: Sequence[AnyMessage] = ()) -> ToolMessage:
        """Gate one call: propose, pause until decided, run (``messages`` is unused: the
        console remembers the thread's rejections)."""
        (answer,) = _run_calls([(self, call)])
        return answer

    def prepare(self, call: ToolCall) -> _Prepared:
        """Propose the call, unless this thread's reviewers rejected the same action
        before: then answer it with their reason and propose nothing (no orphan request)."""
        thread_id = _thread_id()
        call_id = str(call["id"])
        arguments: Mapping[str, Any] = call["args"]
        canonical = self.client.canonicalize(self.tool, arguments, run_id=thread_id)
        digest = canonical.action_digest
        ref = client_ref_for(call_id, action_digest=digest)
        prepared = _Prepared(
            call,
            digest,
            execution_id_for(thread_id, call_id, self.attempt, prefix="lg", action_digest=digest),
        )
        prior = [p for p in canonical.prior_decisions if p.decision == "rejected"]
        if prior:
            own = self.client.lookup(thread_id, ref)
            if own is None:
                prepared.answer = self._message(
                    call,
                    Outcome(
                        "rejected",
                        prior[0].occurrence_id,
                        "This exact call was already rejected in this conversation: "
                        f"{sentence(prior[0].reason)} It was not proposed again; do not "
                        "retry it.",
                        reason=prior[0].reason,
                    ),
                    proposed_digest=digest,
                )
                return prepared
            prepared.occurrence_id = own.occurrence_id  # proposed before: its own decision
            return prepared
        proposed = self.client.propose(
            self.tool,
            arguments,
            run_id=thread_id,
            reason=self.reason(call),
            client_ref=ref,
            requested_by=self.requested_by,
        )
        prepared.occurrence_id = proposed.occurrence_id
        return prepared

    def finish(self, prepared: _Prepared, occurrence: Occurrence) -> ToolMessage | None:
        """Run a decided call once and answer it; None when it went back to review."""
        outcome = run_decided(
            self.client,
            occurrence,
            execution_id=prepared.execution_id,
            execute=self.execute,
            renew_expired=self.renew_expired,
            effect_timeout=self.effect_timeout,
            proposed=prepared.call["args"],
            edit_notice=self.edit_notice,
        )
        if outcome.status in {"pending", "renewed"}:
            return None
        rejected_digest = prepared.digest if outcome.status == "rejected" else None
        return self._message(prepared.call, outcome, proposed_digest=rejected_digest)

    def _message(
        self, call: ToolCall, outcome: Outcome, *, proposed_digest: str | None
    ) -> ToolMessage:
        return ToolMessage(
            content=outcome.message,
            tool_call_id=str(call["id"]),
            name=self.tool,
            status="success" if outcome.ok else "error",
            artifact={
                ARTIFACT_KEY: {
                    "tool": self.tool,
                    "status": outcome.status,
                    "occurrence_id": outcome.occurrence_id,
                    "command_id": outcome.command_id,
                    "reason": outcome.reason,
                    "proposed_digest": proposed_digest,
                    "edited_by": outcome.edited_by,
                }
            },
        )


def gated_tool(
    client: ApprovalConsole,
    tool: str,
    execute: Execute,
    *,
    reason: Callable[[ToolCall], str] | None = None,
    requested_by: str | None = None,
    attempt: int = 1,
    renew_expired: bool = True,
    effect_timeout: float = DEFAULT_EFFECT_TIMEOUT,
) -> GatedTool:
    """Gate ``tool``: ``execute(arguments, idempotency_key)`` runs only what a reviewer
    approved, at most once per approval. For a tool the console executes (``execute`` is
    not called), the node waits up to ``effect_timeout`` seconds for the console's effect
    and tells the model what it was."""
    return GatedTool(
        client,
        tool,
        execute,
        reason=reason,
        requested_by=requested_by,
        attempt=attempt,
        renew_expired=renew_expired,
        effect_timeout=effect_timeout,
    )


def _info(occurrence: Occurrence) -> dict[str, Any]:
    return {
        "occurrence_id": occurrence.occurrence_id,
        "tool": occurrence.tool,
        "status": occurrence.status,
        "action_digest": occurrence.proposal.action_digest,
        "arguments": occurrence.proposal.arguments,
        "run_id": occurrence.run_id,
        "client_ref": occurrence.client_ref,
    }


def _pause(pending: Sequence[Occurrence]) -> None:
    """Stop the graph until it is resumed, once for every call still in review (the
    resume value is not trusted: the node reads the console's decisions again). The value
    names the first occurrence at the top, as a single call's pause always did, and every
    one under ``calls``."""
    interrupt({ARTIFACT_KEY: {**_info(pending[0]), "calls": [_info(o) for o in pending]}})


def _run_calls(gated: Sequence[tuple[GatedTool, ToolCall]]) -> list[ToolMessage]:
    """Propose every call first, pause until none is in review, then run each once."""
    prepared = [(gate, gate.prepare(call)) for gate, call in gated]
    answers: dict[int, ToolMessage] = {
        i: p.answer for i, (_, p) in enumerate(prepared) if p.answer is not None
    }
    while len(answers) < len(prepared):
        waiting = {
            i: gate.client.get(p.occurrence_id)
            for i, (gate, p) in enumerate(prepared)
            if i not in answers
        }
        pending = [o for o in waiting.values() if o.pending]
        if pending:
            _pause(pending)
            continue
        for i, occurrence in waiting.items():
            gate, p = prepared[i]
            if (answer := gate.finish(p, occurrence)) is not None:
                answers[i] = answer
    return [answers[i] for i in range(len(prepared))]


class ToolNode(Protocol):
    """A graph node: called with the graph's state (a mapping holding the messages)."""

    def __call__(self, state: Any) -> dict[str, list[ToolMessage]]: ...


def tool_node(*gates: GatedTool, messages_key: str = "messages") -> ToolNode:
    """A graph node running the last AI message's tool calls through their gates, all of
    them proposed at once and awaited together; a call of a tool without a gate is
    answered with an error message."""
    by_name = {gate.name: gate for gate in gates}

    def node(state: Any) -> dict[str, list[ToolMessage]]:
        """``state``: the graph's state (a mapping with the messages)."""
        messages: Sequence[AnyMessage] = state[messages_key]
        calls: list[ToolCall] = list(getattr(messages[-1], "tool_calls", None) or [])
        gated = [(by_name[c["name"]], c) for c in calls if c["name"] in by_name]
        answers = iter(_run_calls(gated))
        out = [
            next(answers)
            if call["name"] in by_name
            else ToolMessage(
                content=f"Unknown tool {call['name']}.",
                tool_call_id=str(call["id"]),
                status="error",
            )
            for call in calls
        ]
        return {messages_key: out}

    return node
