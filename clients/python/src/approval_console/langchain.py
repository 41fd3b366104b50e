"""LangChain 1.x agents: back ``HumanInTheLoopMiddleware`` with the approval console.

An agent built with ``create_agent`` that pauses tool calls with LangChain's own middleware
switches to console-backed approvals by changing one line::

    from approval_console import ApprovalConsole
    from approval_console.langchain import ConsoleApprovalMiddleware

    console = ApprovalConsole("http://127.0.0.1:8000", key)
    GATED = {"issue_refund": True, "close_case": True}
    agent = create_agent(
        model,
        tools=[issue_refund, close_case, lookup_order],
        # was: middleware=[HumanInTheLoopMiddleware(interrupt_on=GATED)],
        middleware=[ConsoleApprovalMiddleware(console, interrupt_on=GATED)],
        checkpointer=InMemorySaver(),
    )

The tools named in ``interrupt_on`` are proposed to the console when the model calls them:
all of one model message's calls at once (``after_model``), with ``run_id`` = the thread id
and a ``client_ref`` from the tool-call id and the action's digest, after asking the console
for the thread's earlier rejections of the same action (a rejected call retried is answered
with the earlier reason and not proposed again). While any is in review the agent pauses
with ``interrupt()``, as LangChain's middleware does; its value is a ``HITLRequest`` (the
same ``action_requests`` and ``review_configs``) plus the occurrences under
``"approval_console"``. Resume with ``Command(resume=...)``: the value is not trusted (the
reviewers decide in the console), so a program that answered ``{"decisions": [...]}`` runs
unchanged.

The reviewer's decisions become the middleware's, in ``wrap_tool_call``:

* **approve**: the token is picked up for an execution id derived from thread, tool call,
  action and attempt, claimed with the approved action, and only then does the tool run,
  once; inside it :func:`idempotency_key` is the command's key. Its result is reported as
  the effect (an exception as ``outcome_unknown``; raise
  :class:`~approval_console.gate.EffectRejected` for a refusal before any effect);
* **edit**: the tool runs with the reviewer's arguments, and the model's message says what
  the reviewer changed;
* **reject**: the tool does not run; the model gets an error ``ToolMessage`` with the
  reviewer's reason;
* a tool the console executes itself (``issue_refund``, ``send_message``) is never run by
  the agent: the middleware waits up to ``effect_timeout`` seconds for the console's effect
  and tells the model what it was (committed with its receipt, refused and why, unknown).

A process that dies after the approval (before the claim, after it, or in the tool) and is
resumed from the checkpointer (``agent.invoke(None, config)``) runs the tool at most once:
the claim and its recovery are :func:`approval_console.gate.run_decided`'s, as in the
LangGraph adapter.

LangChain's configuration is kept: a tool's ``allowed_decisions`` is enforced (without
``"edit"``, a call a reviewer edited is not run and the model is told why; without
``"approve"``, neither is one approved unchanged; the reviewer's request says so), its
``description`` (a string, or a function of the call, the state and the runtime) is the
proposal's reason, and ``edit_notice`` ends the note on an edit (``None``: no note).
``respond`` (a reviewer's reply sent to the model in place of the tool's result) has no
counterpart in the console, whose reviewers approve, edit or reject: a config that lists
it is refused with a ``ValueError`` (``True`` means approve, edit and reject here), and so
is ``when`` (the tool's contract decides which calls need a reviewer).

Asynchronous agents (``ainvoke``, ``astream``) work too: the async hooks run the console's
(synchronous) calls and waits in a thread of their own, so the event loop is never blocked,
and the tool itself runs on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Literal, TypeVar, cast

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    InterruptOnConfig,
    ToolCallRequest,
)
from langchain.agents.middleware.human_in_the_loop import DecisionType
from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langgraph.runtime import Runtime, get_runtime
from langgraph.types import Command, interrupt

from approval_console.client import ApprovalConsole, AsyncApprovalConsole
from approval_console.gate import (
    DEFAULT_EFFECT_TIMEOUT,
    EDIT_NOTICE,
    Outcome,
    edit_note,
    with_edit,
)
from approval_console.langgraph import ARTIFACT_KEY, GatedTool, _Prepared
from approval_console.models import Occurrence

__all__ = ["ConsoleApprovalMiddleware", "idempotency_key"]

_KEY: ContextVar[str | None] = ContextVar("approval_console_idempotency_key", default=None)

DEFAULT_DESCRIPTION_PREFIX = "Tool execution requires approval"
# What the console's reviewers can do: approve, edit (then approve), reject.
CONSOLE_DECISIONS: tuple[DecisionType, ...] = ("approve", "edit", "reject")

T = TypeVar("T")

Description = str | Callable[[ToolCall, AgentState[Any], Runtime[Any]], str]


def idempotency_key() -> str:
    """The idempotency key of the approved command the running tool executes: pass it to
    the remote service so a repeat of the same call has one effect. Only inside a tool
    that :class:`ConsoleApprovalMiddleware` runs after a claim."""
    key = _KEY.get()
    if key is None:
        raise LookupError("no console-approved tool call is running here")
    return key


@contextlib.contextmanager
def _running_with(key: str) -> Iterator[None]:
    token = _KEY.set(key)
    try:
        yield
    finally:
        _KEY.reset(token)


class _ToolFailed(Exception):
    """The tool answered with an error message: whether it took effect is not known."""


def _text(result: ToolMessage | Command[Any]) -> str:
    return result.text if isinstance(result, ToolMessage) else repr(result)


def _not_run(arguments: Mapping[str, Any], key: str) -> Any:
    raise AssertionError("after_model only proposes; tools run in wrap_tool_call")


class ConsoleApprovalMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """``HumanInTheLoopMiddleware`` whose reviewers decide in the approval console.

    ``interrupt_on`` is LangChain's: tool name to ``True`` (gated: approve, edit or
    reject), ``False`` (not), or an ``InterruptOnConfig`` whose ``allowed_decisions`` are
    enforced and whose ``description`` (a string, or a function of the tool call, the state
    and the runtime) becomes the proposal's reason. ``console`` is a synchronous
    :class:`~approval_console.ApprovalConsole` (also for ``ainvoke``: the async hooks call it
    from a worker thread); the tools' names are their contracts' names in the console.
    ``edit_notice`` is the last sentence of the note that tells the model a reviewer
    changed the arguments, and to what (``None``: no note). ``effect_timeout``: how long to
    wait for the effect of a tool the console executes (and for another process resuming
    the same call). ``requested_by``, ``attempt`` and ``renew_expired`` are the LangGraph
    adapter's (``gated_tool``). ``interrupt_mode`` is LangChain's: ``"batched"`` proposes a
    model turn's calls together and pauses once for them; ``"per_call"`` proposes each call
    as it starts and pauses with one ``ToolApprovalRequest`` interrupt per call.
    """

    def __init__(
        self,
        console: ApprovalConsole,
        interrupt_on: Mapping[str, bool | InterruptOnConfig],
        *,
        description_prefix: str = DEFAULT_DESCRIPTION_PREFIX,
        edit_notice: str | None = EDIT_NOTICE,
        requested_by: str | None = None,
        attempt: int = 1,
        renew_expired: bool = True,
        effect_timeout: float = DEFAULT_EFFECT_TIMEOUT,
        interrupt_mode: Literal["batched", "per_call"] = "batched",
    ) -> None:
        super().__init__()
        if isinstance(console, AsyncApprovalConsole) or not isinstance(console, ApprovalConsole):
            raise TypeError(
                "ConsoleApprovalMiddleware takes an ApprovalConsole (the synchronous client), "
                f"not {type(console).__name__}: under ainvoke its calls run in a worker thread"
            )
        if interrupt_mode not in ("batched", "per_call"):
            raise ValueError(
                f"interrupt_mode must be 'batched' or 'per_call', not {interrupt_mode!r}"
            )
        self.interrupt_mode = interrupt_mode
        self.console = console
        self.description_prefix = description_prefix
        self.edit_notice = edit_notice
        self.requested_by = requested_by
        self.attempt = attempt
        self.renew_expired = renew_expired
        self.effect_timeout = effect_timeout
        self.interrupt_on: dict[str, InterruptOnConfig] = {}
        for tool, config in interrupt_on.items():
            if config is True:
                self.interrupt_on[tool] = InterruptOnConfig(allowed_decisions=[*CONSOLE_DECISIONS])
            elif isinstance(config, Mapping):
                self.interrupt_on[tool] = _checked(tool, config)

    # -- the gate of one call -------------------------------------------------------------

    def _reason(self, call: ToolCall, state: AgentState[Any], runtime: Runtime[Any]) -> str:
        """What the reviewer reads: LangChain's description, and what this agent will not
        run (an edited call, or one approved unchanged) when its config says so."""
        config = self.interrupt_on[call["name"]]
        description: Description | None = config.get("description")
        if callable(description):
            text = description(call, state, runtime)
        elif description is not None:
            text = description
        else:
            text = f"{self.description_prefix}\n\nTool: {call['name']}\nArgs: {call['args']}"
        allowed = config["allowed_decisions"]
        if "edit" not in allowed:
            text += (
                "\n\nThis agent does not accept edits of this call: an edited call will not run."
            )
        if "approve" not in allowed:
            text += "\n\nThis agent does not run this call as proposed: edit it or reject it."
        return text

    def _not_allowed(
        self, gate: GatedTool, prepared: _Prepared, occurrence: Occurrence
    ) -> ToolMessage | None:
        """The answer to an approval the tool's ``allowed_decisions`` do not take (an edit
        where only approve/reject are allowed, or an unchanged approval where only edit/reject
        are): nothing is picked up or claimed, so nothing runs. None when it may run."""
        if occurrence.status != "approved":
            return None  # rejected, still in review, or claimed before (then it was allowed)
        call, tool = prepared.call, occurrence.tool
        allowed = self.interrupt_on[call["name"]]["allowed_decisions"]
        proposal = occurrence.proposal
        if proposal.action_digest != prepared.digest:
            if "edit" in allowed:
                return None
            what = edit_note(proposal.edited_by or "unknown", call["args"], proposal.arguments, "")
            message = (
                f"{what} This agent does not accept edited calls of {tool}, so nothing was "
                "run. Do not retry it; tell the user."
            )
        elif "approve" in allowed:
            return None
        else:
            message = (
                f"A reviewer approved {tool} as you proposed it, but this agent runs {tool} "
                "only after a reviewer's edit, so it was not run. Do not retry it; tell the "
                "user."
            )
        refused = Outcome(
            "refused",
            occurrence.occurrence_id,
            message,
            reason="decision_not_allowed",
            arguments=proposal.arguments,
            edited_by=proposal.edited_by,
        )
        return _tagged(gate._message(call, refused, proposed_digest=None))

    def _gate(
        self,
        name: str,
        state: AgentState[Any],
        runtime: Runtime[Any],
        execute: Callable[[Mapping[str, Any], str], Any] = _not_run,
    ) -> GatedTool:
        """The LangGraph adapter's gate for one tool: it proposes (asking for the thread's
        earlier rejections first) and runs a decided call (pickup, claim, run, report)."""
        return GatedTool(
            self.console,
            name,
            execute,
            reason=lambda call: self._reason(call, state, runtime),
            requested_by=self.requested_by,
            attempt=self.attempt,
            renew_expired=self.renew_expired,
            effect_timeout=self.effect_timeout,
            edit_notice=self.edit_notice,
        )

    def _pause(self, waiting: Sequence[tuple[ToolCall, Occurrence]]) -> None:
        """Stop the agent until resumed (the resume value is not used), with the value
        LangChain's middleware would pause with (a ``HITLRequest``, or in ``per_call``
        mode a ``ToolApprovalRequest``) and the occurrences under ``approval_console``."""
        console = {ARTIFACT_KEY: {"calls": [_info(o, str(c["id"])) for c, o in waiting]}}
        if self.interrupt_mode == "per_call":
            ((call, occurrence),) = waiting
            interrupt(
                {
                    "type": "tool_approval",
                    "tool_call_id": call["id"],
                    "name": call["name"],
                    "args": call["args"],
                    "description": occurrence.reason,
                    **console,
                }
            )
            return
        interrupt(
            {
                "action_requests": [
                    {"name": c["name"], "args": c["args"], "description": o.reason}
                    for c, o in waiting
                ],
                "review_configs": [
                    {
                        "action_name": c["name"],
                        "allowed_decisions": list(
                            self.interrupt_on[c["name"]]["allowed_decisions"]
                        ),
                    }
                    for c, _ in waiting
                ],
                **console,
            }
        )

    # -- the hooks ------------------------------------------------------------------------

    def after_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Propose every gated call of the model's last message at once, and pause until
        the console has decided all of them (re-run on each resume: nothing is proposed
        twice)."""
        last = next((m for m in reversed(state["messages"]) if isinstance(m, AIMessage)), None)
        if last is None or self.interrupt_mode == "per_call":
            return None  # per_call: each call is proposed and paused on in wrap_tool_call
        calls = [c for c in last.tool_calls if c["name"] in self.interrupt_on]
        proposed = [(c, self._gate(c["name"], state, runtime).prepare(c)) for c in calls]
        open_calls = [(c, p.occurrence_id) for c, p in proposed if p.answer is None]
        while True:
            waiting = [(c, self.console.get(i)) for c, i in open_calls]
            pending = [(c, o) for c, o in waiting if o.pending]
            if not pending:
                return None
            self._pause(pending)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Run a gated call as the console decided: once, after a successful claim, with the
        reviewer's arguments; or answer it (rejected, executed by the console, unknown)."""
        call = request.tool_call
        if call["name"] not in self.interrupt_on:
            return handler(request)
        ran: list[tuple[dict[str, Any], ToolMessage | Command[Any]]] = []

        def execute(arguments: Mapping[str, Any], key: str) -> str:
            to_run: ToolCall = {**call, "args": dict(arguments)}
            with _running_with(key):
                result = handler(request.override(tool_call=to_run))
            ran.append((dict(arguments), result))
            if isinstance(result, ToolMessage) and result.status == "error":
                raise _ToolFailed(result.text)
            return _text(result)

        gate = self._gate(call["name"], request.state, get_runtime(), execute)
        prepared = gate.prepare(call)
        if prepared.answer is not None:
            return _tagged(prepared.answer)
        while True:
            occurrence = self.console.get(prepared.occurrence_id)
            if occurrence.pending:
                # per_call, or back in review (renewed after expiry, edited after
                # after_model read it).
                self._pause([(call, occurrence)])
                continue
            if (refused := self._not_allowed(gate, prepared, occurrence)) is not None:
                return refused
            answer = gate.finish(prepared, occurrence)
            if answer is None:
                continue
            if not ran:
                return _tagged(answer)
            arguments, result = ran[-1]
            if _console(answer).get("status") == "executed":
                return _tool_result(
                    result, answer, arguments, proposed=call["args"], notice=self.edit_notice
                )
            # The tool answered with an error: its effect is unknown; its words follow.
            return _tagged(answer, also=f"The tool answered: {_text(result)}")

    # -- async agents (ainvoke, astream) ---------------------------------------------------

    async def aafter_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """:meth:`after_model` in a thread of its own (its proposals and reads are
        blocking HTTP calls); the graph's config travels with the thread's context, so the
        pause is the graph's ``interrupt``."""
        return await _in_own_thread(self.after_model, state, runtime)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """:meth:`wrap_tool_call` in a thread of its own; the tool (``handler``) still runs
        on the event loop, once, between the claim and the effect report, with
        :func:`idempotency_key` set."""
        if request.tool_call["name"] not in self.interrupt_on:
            return await handler(request)
        loop = asyncio.get_running_loop()

        def on_the_loop(to_run: ToolCallRequest) -> ToolMessage | Command[Any]:
            async def run() -> ToolMessage | Command[Any]:
                return await handler(to_run)

            # Scheduled from this thread, the task starts in a copy of this thread's
            # context: the idempotency key set around the call is visible in the tool.
            return asyncio.run_coroutine_threadsafe(run(), loop).result()

        return await _in_own_thread(self.wrap_tool_call, request, on_the_loop)


async def _in_own_thread(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in a new thread, in a copy of this context, awaited. Not the loop's
    default executor (``asyncio.to_thread``): under ``ainvoke`` LangChain runs sync tools
    there, and a gated call that held one of its few threads while its tool waits for
    another would deadlock a message with more gated calls than the executor has threads."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return  # the awaiting task was cancelled
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(cast(T, result))

    def run() -> None:
        try:
            result, error = context.run(func, *args), None
        except BaseException as exc:  # handed to the awaiting task, raised there
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="approval-console-middleware", daemon=True).start()
    return await done


def _checked(tool: str, config: Mapping[str, Any]) -> InterruptOnConfig:
    """A tool's ``InterruptOnConfig``, refused (``ValueError``) where the console cannot do
    what it asks rather than silently ignored."""
    allowed = config.get("allowed_decisions")
    if not allowed or isinstance(allowed, str):
        raise ValueError(
            f"interrupt_on[{tool!r}]: 'allowed_decisions' must be a non-empty list of "
            f"decisions (e.g. ['approve', 'reject']), got {allowed!r}"
        )
    if "respond" in allowed:
        raise ValueError(
            f"interrupt_on[{tool!r}]: 'respond' is not offered: the console's reviewers "
            "approve, edit or reject a call and cannot answer for the tool. Use "
            "HumanInTheLoopMiddleware for this tool, or drop 'respond'"
        )
    unknown = [d for d in allowed if d not in CONSOLE_DECISIONS]
    if unknown:
        raise ValueError(f"interrupt_on[{tool!r}]: unknown decisions {unknown!r}")
    if "approve" not in allowed and "edit" not in allowed:
        raise ValueError(
            f"interrupt_on[{tool!r}]: with only 'reject' allowed the tool could never run; "
            "allow 'approve' or 'edit'"
        )
    if config.get("when") is not None:
        raise ValueError(
            f"interrupt_on[{tool!r}]: 'when' is not supported; the tool's contract in the "
            "console decides which calls need a reviewer"
        )
    return cast(InterruptOnConfig, dict(config))


def _info(occurrence: Occurrence, call_id: str) -> dict[str, Any]:
    return {
        "tool_call_id": call_id,
        "occurrence_id": occurrence.occurrence_id,
        "tool": occurrence.tool,
        "status": occurrence.status,
        "action_digest": occurrence.proposal.action_digest,
        "arguments": occurrence.proposal.arguments,
        "run_id": occurrence.run_id,
        "client_ref": occurrence.client_ref,
    }


def _console(answer: ToolMessage) -> dict[str, Any]:
    """The console's facts about a call, as the LangGraph adapter's message carries them."""
    artifact = answer.artifact if isinstance(answer.artifact, Mapping) else {}
    info = artifact.get(ARTIFACT_KEY)
    return dict(info) if isinstance(info, Mapping) else {}


def _tagged(answer: ToolMessage, *, also: str = "") -> ToolMessage:
    """The gate's answer, with the console's facts in ``response_metadata`` too (where a
    tool's own result carries them)."""
    update: dict[str, Any] = {
        "response_metadata": {**answer.response_metadata, ARTIFACT_KEY: _console(answer)}
    }
    if also:
        update["content"] = f"{answer.text}\n\n{also}"
    return answer.model_copy(update=update)


def _tool_result(
    result: ToolMessage | Command[Any],
    answer: ToolMessage,
    arguments: Mapping[str, Any],
    *,
    proposed: Mapping[str, Any],
    notice: str | None,
) -> ToolMessage | Command[Any]:
    """The tool's own result (it ran once, after the claim), with the console's facts in
    ``response_metadata`` and, after a reviewer's edit, the note for the model in front of
    it (also in a ``Command``'s update, where a tool that returns one carries its message)."""
    info = _console(answer)
    executed = Outcome(
        "executed",
        str(info.get("occurrence_id", "")),
        "",
        arguments=dict(arguments),
        edited_by=info.get("edited_by"),
    )
    note = with_edit(executed, proposed, notice=notice).message.strip()

    def told(message: ToolMessage) -> ToolMessage:
        content = f"{note}\n\nTool response:\n{message.text}" if note else message.content
        metadata = {**message.response_metadata, ARTIFACT_KEY: info}
        return message.model_copy(update={"content": content, "response_metadata": metadata})

    if isinstance(result, ToolMessage):
        return told(result)
    update = result.update
    if not isinstance(update, dict) or not isinstance(update.get("messages"), list):
        return result
    call_id = answer.tool_call_id
    messages = [
        told(m) if isinstance(m, ToolMessage) and m.tool_call_id == call_id else m
        for m in update["messages"]
    ]
    return dataclasses.replace(result, update={**update, "messages": messages})
