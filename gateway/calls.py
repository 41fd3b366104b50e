"""Following one gated call from its journal row to its end, detached from the client's
request: a client that disconnects, or a gateway that restarts, loses no approved call,
and no call runs twice.

A follower runs in the gateway's own task group. The ``tools/call`` that opened the call
waits for it (sending the client an elicitation and progress meanwhile); after a restart
the gateway starts a follower for every unfinished row of its journal, with nobody
waiting. What the follower does depends only on the row's state:

- ``proposed``: wait for the decision; approved → claim (the token picked up again for the
  same execution, if a crash lost it); rejected, timed out, revoked, expired → close.
- ``claimed``: the upstream was never called: call it, once.
- ``calling``: a call may have reached the upstream: report ``outcome_unknown``; the
  operators decide (query, reconcile, accept the ambiguity); never call again.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from django.db import close_old_connections
from mcp import types

from approvals.models import Occurrence
from approvals.vocabulary import ReportedOutcome
from gateway import console
from gateway.contracts import GatewayTool
from gateway.faults import crash_point
from gateway.models import GatewayCall
from gateway.upstreams import Effect, UpstreamSession, effect_of

logger = logging.getLogger(__name__)
T = TypeVar("T")


async def in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a database step in a worker thread (Django's ORM is synchronous)."""

    def step() -> T:
        # A worker thread keeps its connection between steps, with no request to end it:
        # drop one the server closed (a restart, an idle timeout) before using it.
        close_old_connections()
        return func(*args, **kwargs)

    return await anyio.to_thread.run_sync(step)


def text_result(text: str, *, error: bool) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)


_CLOSED = {
    Occurrence.Status.REJECTED: "A reviewer rejected this call: {reason} Nothing was run; "
    "do not retry it unchanged.",
    Occurrence.Status.TIMED_OUT: "Nobody decided this call before its deadline "
    "(timed_out): nothing was run. Ask again later if it is still needed.",
    Occurrence.Status.REVOKED: "An admin revoked the approval of this call: nothing was run.",
    Occurrence.Status.EXPIRED: "The approval expired before the call could run: nothing was run.",
}

UNKNOWN = (
    "The call was sent to the upstream server, but its outcome is unknown ({detail}). An "
    "operator will find out what happened; do not retry it."
)


@dataclass
class Follower:
    """One gated call followed to its end; ``result`` is what the client is answered."""

    call_id: uuid.UUID
    occurrence_id: uuid.UUID
    done: anyio.Event = field(default_factory=anyio.Event)
    result: types.CallToolResult | None = None
    # Set by the waiting request: what it asked, to tell the model about a reviewer's edit.
    asked: dict[str, Any] | None = None


class Calls:
    """The gateway's followers, one per journal row, at most one each."""

    def __init__(
        self,
        *,
        gateway: str,
        tools: dict[str, GatewayTool],
        links: dict[str, console.Link],
        sessions: dict[str, UpstreamSession],
        poll_seconds: float,
    ) -> None:
        self.gateway = gateway
        self.tools = tools
        self.links = links
        self.sessions = sessions
        self.poll_seconds = poll_seconds
        self.followers: dict[uuid.UUID, Follower] = {}
        self._group: anyio.abc.TaskGroup | None = None

    def attach(self, group: anyio.abc.TaskGroup) -> None:
        self._group = group

    def follow(self, call_id: uuid.UUID, occurrence_id: uuid.UUID, tool: GatewayTool) -> Follower:
        follower = self.followers.get(call_id)
        if follower is None:
            follower = self.followers[call_id] = Follower(call_id, occurrence_id)
            assert self._group is not None, "attach() the gateway's task group first"
            self._group.start_soon(self._run, follower, tool)
        return follower

    async def resume(self) -> int:
        """Follow every call an earlier process of this gateway left unfinished."""
        rows = await in_thread(console.calls_open, self.gateway)
        resumed = 0
        for call_id, _state, upstream, upstream_tool in rows:
            tool = self._tool(upstream, upstream_tool)
            if tool is None:
                logger.warning("journal row %s names a tool no longer offered", call_id)
                continue
            occurrence_id = await in_thread(
                lambda cid=call_id: GatewayCall.objects.get(pk=cid).occurrence_id
            )
            self.follow(call_id, occurrence_id, tool)
            resumed += 1
        return resumed

    def _tool(self, upstream: str, upstream_tool: str) -> GatewayTool | None:
        for tool in self.tools.values():
            if tool.upstream.name == upstream and tool.upstream_name == upstream_tool:
                return tool
        return None

    async def _run(self, follower: Follower, tool: GatewayTool) -> None:
        try:
            follower.result = await self._steps(follower, tool)
        except Exception:
            logger.exception("the gateway call %s stopped", follower.call_id)
            follower.result = text_result(
                "The gateway failed while handling this call; its state is kept in the "
                "console (an operator can see it). Do not retry it.",
                error=True,
            )
        finally:
            follower.done.set()
            self.followers.pop(follower.call_id, None)

    async def _steps(self, follower: Follower, tool: GatewayTool) -> types.CallToolResult:
        call_id, link = follower.call_id, self.links[tool.upstream.name]
        state = await in_thread(lambda: GatewayCall.objects.get(pk=call_id).state)
        if state == GatewayCall.State.CALLING:
            return await self._settle_unknown(call_id, link, "the gateway stopped during the call")
        if state == GatewayCall.State.DONE:
            return await in_thread(_done_result, call_id)
        if state == GatewayCall.State.PROPOSED:
            closed = await self._wait(call_id)
            if closed is not None:
                return closed
            crash_point("before_claim", str(call_id))
        claimed = await in_thread(console.call_claim, call_id, link)
        if claimed is None:
            return await in_thread(_done_result, call_id)
        if isinstance(claimed, console.Refused):
            return text_result(
                f"The approval could not be used ({claimed.code}): {claimed.message} Nothing "
                "was run.",
                error=True,
            )
        crash_point("after_claim", str(call_id))
        if not await in_thread(console.call_start, call_id):
            return await in_thread(_done_result, call_id)
        effect = await self._call(tool, claimed)
        crash_point("after_call", str(call_id))
        await in_thread(
            console.call_settle,
            call_id,
            link,
            outcome=effect.outcome,
            result_digest=effect.receipt,
            detail=effect.detail,
        )
        return _answer(effect, claimed.arguments, follower.asked, tool.sensitive)

    async def _wait(self, call_id: uuid.UUID) -> types.CallToolResult | None:
        """Wait for the decision; the answer when the call will not run, else None."""
        while True:
            decision = await in_thread(console.call_decision, call_id)
            if decision.status in (Occurrence.Status.APPROVED, Occurrence.Status.CLAIMED):
                return None
            template = _CLOSED.get(Occurrence.Status(decision.status))
            if template is not None:
                text = template.format(reason=_sentence(decision.reason))
                await in_thread(console.call_close, call_id, outcome=decision.status, detail=text)
                return text_result(text, error=True)
            await anyio.sleep(self.poll_seconds)

    async def _call(self, tool: GatewayTool, claimed: console.Claimed) -> Effect:
        session = self.sessions[tool.upstream.name]
        try:
            result = await session.call(
                tool.upstream_name, claimed.arguments, claimed.idempotency_key
            )
        except Exception as exc:
            logger.warning(
                "upstream %s: %s failed: %r", tool.upstream.name, tool.upstream_name, exc
            )
            return effect_of(None, exc)
        return effect_of(result, None)

    async def _settle_unknown(
        self, call_id: uuid.UUID, link: console.Link, detail: str
    ) -> types.CallToolResult:
        await in_thread(
            console.call_settle,
            call_id,
            link,
            outcome=ReportedOutcome.OUTCOME_UNKNOWN,
            detail=detail,
        )
        return text_result(UNKNOWN.format(detail=detail), error=True)


def _sentence(reason: str) -> str:
    reason = reason.strip() or "no reason given"
    return reason if reason.endswith((".", "!", "?")) else f"{reason}."


def _answer(
    effect: Effect,
    arguments: dict[str, Any],
    asked: dict[str, Any] | None,
    sensitive: tuple[str, ...] = (),
) -> types.CallToolResult:
    if effect.outcome == ReportedOutcome.OUTCOME_UNKNOWN or effect.result is None:
        return text_result(UNKNOWN.format(detail=effect.detail), error=True)
    result = effect.result
    if asked is not None and asked != arguments:
        note = types.TextContent(
            type="text",
            text="A reviewer changed the arguments before approving; the call ran with "
            f"{json.dumps(_masked(arguments, sensitive), sort_keys=True)}.",
        )
        result = result.model_copy(update={"content": [note, *result.content]})
    return result


def _masked(arguments: dict[str, Any], sensitive: tuple[str, ...]) -> dict[str, Any]:
    """The arguments with the sensitive ones' values left out (the model sent them; the
    gateway does not repeat them)."""
    return {k: "(sensitive)" if k in sensitive else v for k, v in arguments.items()}


def _done_result(call_id: uuid.UUID) -> types.CallToolResult:
    """The answer for a call another process (or an earlier one) settled."""
    call = GatewayCall.objects.get(pk=call_id)
    if call.outcome == ReportedOutcome.COMMITTED:
        return text_result(
            f"This call already ran (receipt sha256:{call.result_digest}).", error=False
        )
    if call.outcome == ReportedOutcome.OUTCOME_UNKNOWN:
        return text_result(UNKNOWN.format(detail=call.detail), error=True)
    return text_result(call.detail or f"This call ended {call.outcome}.", error=True)
