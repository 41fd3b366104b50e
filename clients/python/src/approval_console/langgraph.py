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
name the occurrence only. A rejection becomes a ``ToolMessage`` with the reason; a later
call of the same thread with the same action (a model retrying) is answered from that
message without a second proposal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from langchain_core.messages import AnyMessage, ToolCall, ToolMessage
from langgraph.config import get_config
from langgraph.types import interrupt

from approval_console.client import ApprovalConsole
from approval_console.execution import client_ref_for, execution_id_for
from approval_console.gate import DEFAULT_EFFECT_TIMEOUT, Execute, Outcome, run_decided, sentence
from approval_console.models import Occurrence

ARTIFACT_KEY = "approval_console"


def _thread_id() -> str:
    configurable = get_config().get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if not thread_id:
        raise RuntimeError("gated tools need a checkpointer and a thread_id in the config")
    return str(thread_id)


def _rejections(messages: Iterable[Any], tool: str) -> dict[str, str]:
    """Digest -> reason of this thread's rejected calls of ``tool`` (from the artifacts)."""
    found: dict[str, str] = {}
    for message in messages:
        artifact = getattr(message, "artifact", None)
        info = artifact.get(ARTIFACT_KEY) if isinstance(artifact, dict) else None
        if (
            isinstance(info, dict)
            and info.get("tool") == tool
            and info.get("status") == "rejected"
            and info.get("proposed_digest")
        ):
            found[str(info["proposed_digest"])] = str(info.get("reason") or "")
    return found


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
    ) -> None:
        self.client = client
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
        thread_id = _thread_id()
        call_id = str(call["id"])
        arguments: Mapping[str, Any] = call["args"]
        digest = self.client.canonicalize(self.tool, arguments).action_digest
        rejected = _rejections(messages, self.tool)
        if rejected and digest in rejected:
            return self._message(
                call,
                Outcome(
                    "rejected",
                    "",
                    f"This exact call was already rejected in this conversation: "
                    f"{sentence(rejected[digest])} It was not proposed again; do not retry "
                    "it.",
                    reason=rejected[digest],
                ),
                proposed_digest=digest,
            )
        proposed = self.client.propose(
            self.tool,
            arguments,
            run_id=thread_id,
            reason=self.reason(call),
            client_ref=client_ref_for(call_id, action_digest=digest),
            requested_by=self.requested_by,
        )
        prior = [p for p in proposed.prior_decisions if p.decision == "rejected"]
        if prior and proposed.status == "pending_review":
            # The thread's messages lost the rejection; the console remembers it.
            return self._message(
                call,
                Outcome(
                    "rejected",
                    proposed.occurrence_id,
                    f"This exact call was rejected before in this run: "
                    f"{sentence(prior[0].reason)} Do not retry it.",
                    reason=prior[0].reason,
                ),
                proposed_digest=proposed.proposal.action_digest,
            )
        execution_id = execution_id_for(
            thread_id, call_id, self.attempt, prefix="lg", action_digest=digest
        )
        while True:
            occurrence = self.client.get(proposed.occurrence_id)
            if occurrence.pending:
                self._pause(occurrence)
                continue
            outcome = run_decided(
                self.client,
                occurrence,
                execution_id=execution_id,
                execute=self.execute,
                renew_expired=self.renew_expired,
                effect_timeout=self.effect_timeout,
                proposed=arguments,
            )
            if outcome.status in {"pending", "renewed"}:
                self._pause(self.client.get(proposed.occurrence_id))
                continue
            rejected_digest = digest if outcome.status == "rejected" else None
            return self._message(call, outcome, proposed_digest=rejected_digest)

    def _pause(self, occurrence: Occurrence) -> None:
        """Stop the graph until it is resumed (the resume value is not trusted: the loop
        reads the console's decision again)."""
        interrupt(
            {
                ARTIFACT_KEY: {
                    "occurrence_id": occurrence.occurrence_id,
                    "tool": occurrence.tool,
                    "status": occurrence.status,
                    "action_digest": occurrence.proposal.action_digest,
                    "arguments": occurrence.proposal.arguments,
                    "run_id": occurrence.run_id,
                    "client_ref": occurrence.client_ref,
                }
            }
        )

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


class ToolNode(Protocol):
    """A graph node: called with the graph's state (a mapping holding the messages)."""

    def __call__(self, state: Any) -> dict[str, list[ToolMessage]]: ...


def tool_node(*gates: GatedTool, messages_key: str = "messages") -> ToolNode:
    """A graph node running the last AI message's tool calls through their gates; a call of
    a tool without a gate is answered with an error message."""
    by_name = {gate.name: gate for gate in gates}

    def node(state: Any) -> dict[str, list[ToolMessage]]:
        """``state``: the graph's state (a mapping with the messages)."""
        messages: Sequence[AnyMessage] = state[messages_key]
        calls: list[ToolCall] = list(getattr(messages[-1], "tool_calls", None) or [])
        out: list[ToolMessage] = []
        for call in calls:
            gate = by_name.get(call["name"])
            if gate is None:
                out.append(
                    ToolMessage(
                        content=f"Unknown tool {call['name']}.",
                        tool_call_id=str(call["id"]),
                        status="error",
                    )
                )
                continue
            out.append(gate(call, messages))
        return {messages_key: out}

    return node
