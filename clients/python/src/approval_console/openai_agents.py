"""OpenAI Agents SDK bridge: the SDK's tool approvals decided in the approval console.

::

    from agents import Agent, Runner, RunState
    from approval_console import AsyncApprovalConsole
    from approval_console.openai_agents import ConsoleBridge

    bridge = ConsoleBridge(AsyncApprovalConsole(url, key), run_id="conversation-7")
    close_case = await bridge.tool_from_contract("close_case", close_case_impl)
    agent = Agent(name="support", tools=[close_case])

    result = await Runner.run(agent, "Close case 77")
    await bridge.submit(result.interruptions)          # one proposal per approval request
    saved = result.to_state().to_json()                 # store it; the process may stop

    state = await RunState.from_json(agent, saved)      # later, maybe in another process
    if (await bridge.resolve(state)).ready:             # the console's decisions, applied
        result = await Runner.run(agent, state)

The gated tools have ``needs_approval=True``, so the SDK interrupts the run before each
call. :meth:`ConsoleBridge.submit` proposes each interruption (``run_id`` = the bridge's
run, ``client_ref`` from the call id: submitting twice proposes nothing new).
:meth:`ConsoleBridge.resolve` reads the console's decision for each interruption of a
``RunState`` and applies it: ``state.approve(item)`` for an approval, ``state.reject(item,
rejection_message=<the reviewer's reason>)`` for a rejection, never ``always_approve``; an
approval that expired unclaimed is renewed and waits again. The SDK's approval only lets
the tool start: inside it the bridge picks up the token for the execution id of (run, call,
attempt), claims what the reviewer approved (an edit included) and runs the tool once. A
saved state resumed twice (or after a crash) runs the tool once: the second claim finds the
approval consumed by this execution and the command's effect recorded. Nothing the bridge
stores holds a token; the run state holds only the SDK's own items.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents import FunctionTool, RunState, ToolApprovalItem
from agents.tool_context import ToolContext

from approval_console.client import AsyncApprovalConsole
from approval_console.execution import client_ref_for, execution_id_for
from approval_console.gate import (
    DEFAULT_EFFECT_TIMEOUT,
    AsyncExecute,
    Outcome,
    arun_decided,
    sentence,
)
from approval_console.models import Occurrence, Proposed


@dataclass
class Resolution:
    """What :meth:`ConsoleBridge.resolve` did to a run state's interruptions."""

    approved: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # call id -> reason
    pending: list[str] = field(default_factory=list)
    occurrences: dict[str, str] = field(default_factory=dict)  # call id -> occurrence id

    @property
    def ready(self) -> bool:
        """Every interruption is decided: run the state again."""
        return not self.pending


def _arguments(item: ToolApprovalItem) -> dict[str, Any]:
    raw = item.arguments or "{}"
    parsed = json.loads(raw)
    if not isinstance(parsed, dict):
        raise ValueError(f"tool call {item.call_id} has arguments that are not an object")
    return parsed


def _parsed(raw: str) -> dict[str, Any] | None:
    """The model's arguments as it sent them (None if they are not a JSON object)."""
    try:
        parsed = json.loads(raw or "{}")
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _repeat_message(reason: str) -> str:
    return (
        f"This exact call was already rejected in this conversation: {sentence(reason)} "
        "It was not proposed again; do not retry it, tell the user."
    )


class ConsoleBridge:
    """Gates tools of one agent run (``run_id``: the conversation or run the state belongs
    to; the same value after a restart)."""

    def __init__(
        self,
        client: AsyncApprovalConsole,
        run_id: str,
        *,
        requested_by: str | None = None,
        attempt: int = 1,
        renew_expired: bool = True,
        effect_timeout: float = DEFAULT_EFFECT_TIMEOUT,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.requested_by = requested_by
        self.attempt = attempt
        self.renew_expired = renew_expired
        # How long a console-executed tool's call waits for the console's effect.
        self.effect_timeout = effect_timeout
        self._gated: set[str] = set()
        self.outcomes: list[Outcome] = []
        # Interruptions submit() did not propose: repeats of a rejected action (call id ->
        # the earlier reason).
        self.refused: dict[str, str] = {}

    def execution_id(self, call_id: str, action_digest: str | None = None) -> str:
        return execution_id_for(
            self.run_id, call_id, self.attempt, prefix="oa", action_digest=action_digest
        )

    async def _digest(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The digest of the action the model proposed (the client_ref and execution id
        carry it: a model reusing a call id for another action makes a new request)."""
        return (await self.client.canonicalize(name, arguments)).action_digest

    async def _ref(self, item: ToolApprovalItem) -> str:
        assert item.name is not None and item.call_id is not None
        digest = await self._digest(item.name, _arguments(item))
        return client_ref_for(item.call_id, action_digest=digest)

    # --- tools --------------------------------------------------------------------------

    def function_tool(
        self,
        name: str,
        execute: AsyncExecute,
        *,
        description: str,
        params_json_schema: dict[str, Any],
    ) -> FunctionTool:
        """A ``FunctionTool`` needing approval whose body claims and runs ``execute``
        (``await execute(approved_arguments, idempotency_key)``)."""
        self._gated.add(name)

        async def invoke(ctx: ToolContext[Any], model_arguments: str) -> str:
            outcome = await self._run(name, ctx.tool_call_id, execute, model_arguments)
            self.outcomes.append(outcome)
            return outcome.message

        return FunctionTool(
            name=name,
            description=description,
            params_json_schema=params_json_schema,
            on_invoke_tool=invoke,
            strict_json_schema=False,
            needs_approval=True,
        )

    async def tool_from_contract(
        self, name: str, execute: AsyncExecute, *, description: str | None = None
    ) -> FunctionTool:
        """:meth:`function_tool` with the console's contract as the parameters' schema."""
        contract = await self.client.tool(name)
        schema = dict(contract.arguments_schema)
        schema.pop("$schema", None)
        return self.function_tool(
            name,
            execute,
            description=description or contract.description or name,
            params_json_schema=schema,
        )

    async def _run(
        self, name: str, call_id: str, execute: AsyncExecute, model_arguments: str
    ) -> Outcome:
        proposed = _parsed(model_arguments)
        digest = await self._digest(name, proposed or {})
        ref = client_ref_for(call_id, action_digest=digest)
        occurrence = await self.client.lookup(self.run_id, ref)
        if occurrence is None:
            return Outcome(
                "refused", "", f"{name} was not proposed to the approval console; not run."
            )
        return await arun_decided(
            self.client,
            occurrence,
            execution_id=self.execution_id(call_id, digest),
            execute=execute,
            renew_expired=False,  # the SDK approved it already; renewing is resolve()'s part
            effect_timeout=self.effect_timeout,
            proposed=proposed,
        )

    # --- approvals ----------------------------------------------------------------------

    def _gated_items(self, items: Sequence[ToolApprovalItem]) -> list[ToolApprovalItem]:
        return [i for i in items if i.name in self._gated and i.call_id]

    async def submit(
        self, interruptions: Sequence[ToolApprovalItem], *, reason: str | None = None
    ) -> list[Proposed]:
        """Propose each gated interruption (again: the same occurrence, nothing new). One
        that repeats an action this run's reviewers rejected is not proposed: it is in
        :attr:`refused` (call id -> the earlier reason), and :meth:`resolve` rejects it."""
        proposed = []
        for item in self._gated_items(interruptions):
            answer = await self._propose(item, reason)
            if isinstance(answer, str):
                self.refused[str(item.call_id)] = answer
            else:
                proposed.append(answer)
        return proposed

    async def _propose(self, item: ToolApprovalItem, reason: str | None) -> Proposed | str:
        """The proposal, or the reason this run's reviewers rejected the same action
        before (then nothing is proposed: no second review, no request nobody decides)."""
        assert item.name is not None and item.call_id is not None
        arguments = _arguments(item)
        canonical = await self.client.canonicalize(item.name, arguments, run_id=self.run_id)
        ref = client_ref_for(item.call_id, action_digest=canonical.action_digest)
        prior = [p for p in canonical.prior_decisions if p.decision == "rejected"]
        if prior and await self.client.lookup(self.run_id, ref) is None:
            return prior[0].reason
        return await self.client.propose(
            item.name,
            arguments,
            run_id=self.run_id,
            reason=reason or f"The agent called {item.name}.",
            client_ref=ref,
            requested_by=self.requested_by,
        )

    async def resolve(self, state: RunState[Any, Any]) -> Resolution:
        """Apply the console's decisions to the state's interruptions. An interruption not
        proposed yet is proposed, unless it repeats an action of this run (this state or an
        earlier one under the same run id) that a reviewer rejected: that one is rejected
        at once with the earlier reason (no second review)."""
        resolution = Resolution()
        for item in self._gated_items(state.get_interruptions()):
            call_id = str(item.call_id)
            occurrence = await self.client.lookup(self.run_id, await self._ref(item))
            if occurrence is None:
                answer = await self._propose(item, None)
                if isinstance(answer, str):
                    state.reject(item, rejection_message=_repeat_message(answer))
                    resolution.rejected[call_id] = answer
                else:
                    resolution.occurrences[call_id] = answer.occurrence_id
                    resolution.pending.append(call_id)
                continue
            resolution.occurrences[call_id] = occurrence.occurrence_id
            decision = await self._decision(occurrence)
            if decision == "approved":
                state.approve(item)
                resolution.approved.append(call_id)
            elif decision == "rejected":
                reason = occurrence.rejection_reason or "rejected"
                state.reject(
                    item,
                    rejection_message=f"A reviewer rejected this call: {sentence(reason)} "
                    "Do not retry it; tell the user.",
                )
                resolution.rejected[call_id] = reason
            else:
                resolution.pending.append(call_id)
        return resolution

    async def _decision(self, occurrence: Occurrence) -> str:
        """approved, rejected or pending (an expired approval is renewed: pending again)."""
        status = occurrence.status
        approval = occurrence.approval
        if status in {"approved", "claimed", "auto_admitted"}:
            expired = status == "approved" and approval is not None and approval.state == "expired"
            if not expired:
                return "approved"
        if status == "rejected":
            return "rejected"
        if status == "revoked":
            return "rejected"
        if status in {"approved", "expired"} and self.renew_expired:
            await self.client.renew(occurrence.occurrence_id)
        return "pending"

    async def wait(self, state: RunState[Any, Any], *, timeout: float = 900.0) -> Resolution:
        """Wait for every pending interruption's review (together, not one after the
        other), then :meth:`resolve`."""
        resolution = await self.resolve(state)
        await asyncio.gather(
            *(
                self.client.wait(resolution.occurrences[call_id], timeout=timeout)
                for call_id in resolution.pending
            )
        )
        return await self.resolve(state) if resolution.pending else resolution
