"""Run one decided tool call exactly once: what both framework adapters do after review.

Given an occurrence that left review, :func:`run_decided` (sync) or
:func:`arun_decided` (async):

1. a rejection becomes an outcome with the reviewer's reason (nothing runs);
2. an approval whose token this execution has not used is picked up **with the execution
   id** (after a crash between pickup and claim the same execution gets a fresh token: a
   re-delivery), and claimed with the arguments the reviewer approved (an edited version
   is what runs, never the model's first draft);
3. a runtime-executed command is executed once with its idempotency key and its effect
   reported; for a console-executed one the gate waits (long-polling, at most
   ``effect_timeout`` seconds) for the effect the console records and reports that:
   committed with its receipt, refused with the reason, unknown (an operator decides),
   interrupted (credentials to renew), or still on its way when the time ran out. Never
   "approved" alone: the model must not tell the user a refund happened that was declined;
4. when the claim was made before for this execution (the pickup answers ``409 claimed``
   naming it, or the claim ``duplicate_delivery``), another process resuming the same
   execution may be running the tool right now: the gate waits up to ``effect_timeout``
   for the effect it reports, and tells the model that. Only if none comes is the claimer
   taken for dead (a crash after the claim): an effect never reported runs again only for
   a contract whose replay is safe (``read_only``, ``idempotent_with_key``), otherwise it is
   reported ``outcome_unknown`` for an operator. A claim refused as ``replayed`` (the other
   process picked the token up again, or claimed first) waits for that process's outcome
   the same way and reports nothing;
5. an approval that expired unclaimed is renewed (sent back to review) when allowed.

The raw token lives only in a local variable between pickup and claim.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from approval_console import errors
from approval_console.client import ApprovalConsole, AsyncApprovalConsole
from approval_console.models import SETTLED_EFFECTS, CommandDetail, Occurrence

Status = Literal[
    "executed",
    "already_executed",
    "executed_by_console",
    "executing",
    "interrupted",
    "rejected",
    "pending",
    "renewed",
    "outcome_unknown",
    "failed",
    "refused",
    # Nobody decided before the contract's final deadline: not run, not a rejection.
    "timed_out",
]

# Contracts whose call may be repeated with the same idempotency key without a second effect.
REPLAY_SAFE = frozenset({"read_only", "idempotent_with_key"})
RECEIPT_MAX = 200
# How long a gate waits for an effect it does not produce itself (the console's adapter).
DEFAULT_EFFECT_TIMEOUT = 60.0


class EffectRejected(Exception):
    """Raise from a tool to say the remote refused the call before any effect: reported
    as ``rejected``. Any other exception is reported as ``outcome_unknown``."""


@dataclass(frozen=True)
class Outcome:
    """What became of a tool call. ``message`` is meant for the model."""

    status: Status
    occurrence_id: str
    message: str
    result: Any = None
    command_id: str | None = None
    reason: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    edited_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in {"executed", "already_executed", "executed_by_console"}


def receipt_of(result: Any) -> str:
    return str(result)[:RECEIPT_MAX]


def _rejected(occurrence: Occurrence, reason: str) -> Outcome:
    return Outcome(
        "rejected",
        occurrence.occurrence_id,
        f"A reviewer rejected this call ({occurrence.tool}): {sentence(reason)} "
        "Do not retry it; tell the user.",
        reason=reason,
        arguments=occurrence.proposal.arguments,
    )


def _settled(occurrence: Occurrence, detail: CommandDetail) -> Outcome | None:
    """The outcome of a command whose effect is already recorded, or None if not sent."""
    tool, command_id = occurrence.tool, detail.command_id

    def outcome(status: Status, message: str) -> Outcome:
        return Outcome(
            status,
            occurrence.occurrence_id,
            message,
            command_id=command_id,
            arguments=occurrence.proposal.arguments,
            edited_by=occurrence.proposal.edited_by,
        )

    if detail.executed_by == "console":
        return _by_console(occurrence, detail)
    if detail.effect_state == "not_sent":
        return None
    if detail.effect_state in {"committed", "reconciled"}:
        return outcome(
            "already_executed",
            f"{tool} was already executed for this approval (command {command_id}); "
            "it was not run again.",
        )
    if detail.effect_state == "rejected":
        return outcome(
            "failed", f"{tool} was refused before it took effect (command {command_id})."
        )
    return outcome(
        "outcome_unknown",
        f"Whether {tool} took effect is unknown (command {command_id}, "
        f"{detail.effect_state}); an operator will reconcile it. Do not retry it.",
    )


def _by_console(occurrence: Occurrence, detail: CommandDetail) -> Outcome:
    """What the console's own execution of the command came to, in words for the model."""
    tool, command_id = occurrence.tool, detail.command_id
    ran = f"{tool} with {dict(occurrence.proposal.arguments)}"

    def outcome(status: Status, message: str, reason: str | None = None) -> Outcome:
        return Outcome(
            status,
            occurrence.occurrence_id,
            message,
            command_id=command_id,
            reason=reason,
            arguments=occurrence.proposal.arguments,
            edited_by=occurrence.proposal.edited_by,
        )

    state = detail.effect_state
    if state in {"committed", "reconciled"}:
        receipt = f", receipt {detail.receipt}" if detail.receipt else ""
        return outcome(
            "executed_by_console",
            f"The console executed {ran}: it took effect (command {command_id}{receipt}).",
        )
    if state == "rejected" and detail.interrupted:
        return outcome(
            "interrupted",
            f"The console's call of {ran} was refused by the remote service's authentication "
            f"before it took effect (command {command_id}); the console calls again once an "
            "admin renews its credentials. Nothing has happened yet. Do not retry it; tell "
            "the user it is delayed.",
        )
    if state == "rejected":
        why = detail.detail or "no reason given"
        return outcome(
            "failed",
            f"The console called {ran} and the remote service refused it: {sentence(why)} "
            f"Nothing took effect (command {command_id}). Tell the user; do not retry it.",
            reason=why,
        )
    if state == "compensated":
        return outcome(
            "failed",
            f"The console executed {ran} and an operator then compensated (undid) it "
            f"(command {command_id}). Tell the user it did not stand.",
        )
    if state == "outcome_unknown":
        return outcome(
            "outcome_unknown",
            f"The console called {ran} and whether it took effect is unknown "
            f"(command {command_id}); an operator will decide. Do not retry it; tell the "
            "user it is being checked.",
        )
    return outcome(
        "executing",
        f"{ran} was approved and the console is executing it (command {command_id}, effect "
        f"{state}); its outcome is not known yet. Do not retry it and do not tell the user "
        "it is done.",
    )


def sentence(text: str) -> str:
    """``text`` ending in one full stop: a reason that ends in its own keeps only that
    (the model read "a refund.." before)."""
    text = text.strip().rstrip(".").rstrip()
    return f"{text}." if text else "no reason given."


def _console_effect(
    client: ApprovalConsole, occurrence: Occurrence, detail: CommandDetail, timeout: float
) -> CommandDetail:
    """The console-executed command's detail once its effect is recorded (or at timeout)."""
    if detail.settled:
        return detail
    _wait_settled(client, occurrence.occurrence_id, detail.command_id, timeout)
    return client.command(detail.command_id)


async def _aconsole_effect(
    client: AsyncApprovalConsole, occurrence: Occurrence, detail: CommandDetail, timeout: float
) -> CommandDetail:
    if detail.settled:
        return detail
    with contextlib.suppress(errors.WaitTimeout):
        await client.watch(
            occurrence.occurrence_id,
            _settled_command(detail.command_id),
            timeout=timeout,
            what="without the command's effect",
        )
    return await client.command(detail.command_id)


def _settled_command(command_id: str) -> Callable[[Occurrence], bool]:
    def settled(occurrence: Occurrence) -> bool:
        return any(
            c.id == command_id and c.effect_state in SETTLED_EFFECTS for c in occurrence.commands
        )

    return settled


def _wait_settled(
    client: ApprovalConsole, occurrence_id: str, command_id: str, timeout: float
) -> None:
    with contextlib.suppress(errors.WaitTimeout):
        client.watch(
            occurrence_id,
            _settled_command(command_id),
            timeout=timeout,
            what="without the command's effect",
        )


def _executed(occurrence: Occurrence, detail: CommandDetail, result: Any) -> Outcome:
    return Outcome(
        "executed",
        occurrence.occurrence_id,
        f"{occurrence.tool} ran with {dict(occurrence.proposal.arguments)}. "
        f"Result: {receipt_of(result)}",
        result=result,
        command_id=detail.command_id,
        arguments=occurrence.proposal.arguments,
        edited_by=occurrence.proposal.edited_by,
    )


_MISSING = object()
# Outcomes of a call that was approved (and perhaps edited) before it ran, or was to run.
_AFTER_APPROVAL = frozenset(
    {
        "executed",
        "already_executed",
        "executed_by_console",
        "executing",
        "interrupted",
        "outcome_unknown",
        "failed",
    }
)


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """``amount_minor from 7700 to 5000; note removed (was "x")``: what an edit changed."""
    parts = []
    for key in sorted({*before, *after}):
        old, new = before.get(key, _MISSING), after.get(key, _MISSING)
        if old == new:
            continue
        if old is _MISSING:
            parts.append(f"{key} added as {_show(new)}")
        elif new is _MISSING:
            parts.append(f"{key} removed (was {_show(old)})")
        else:
            parts.append(f"{key} from {_show(old)} to {_show(new)}")
    return "; ".join(parts)


# The last sentence of the note on a reviewer's edit (``edit_notice`` replaces it).
EDIT_NOTICE = (
    "The changed call is the one approved; tell the user what actually happened, not what "
    "you asked for."
)


def edit_note(
    edited_by: str,
    proposed: Mapping[str, Any] | None,
    arguments: Mapping[str, Any],
    notice: str = EDIT_NOTICE,
) -> str:
    """``A reviewer (rita) changed the arguments you proposed before approving:
    amount_minor from 7700 to 5000.`` and ``notice``: what an edit changed, for the model."""
    changes = _changes(proposed, arguments) if proposed is not None else ""
    what = changes or f"they are now {_show(arguments)}"
    return (
        f"A reviewer ({edited_by}) changed the arguments you proposed before approving: "
        f"{what}. {notice}"
    ).strip()


def with_edit(
    outcome: Outcome, proposed: Mapping[str, Any] | None, *, notice: str | None = EDIT_NOTICE
) -> Outcome:
    """The outcome, its message saying so when a reviewer changed the arguments the model
    proposed (and to what): the model must not report its own draft as what happened.
    ``notice`` is the note's last sentence; None adds no note (the caller's choice, as
    LangChain's ``edit_notice=None``)."""
    if not outcome.edited_by or outcome.status not in _AFTER_APPROVAL or notice is None:
        return outcome
    note = edit_note(outcome.edited_by, proposed, outcome.arguments, notice)
    return replace(outcome, message=f"{outcome.message} {note}")


def _unknown_detail(exc: BaseException) -> str:
    return f"the tool raised {type(exc).__name__}"[:2000]


def _ours(occurrence: Occurrence, execution_id: str) -> str | None:
    for command in occurrence.commands:
        if command.execution_id == execution_id:
            return command.id
    return None


def _not_decided(occurrence: Occurrence) -> Outcome | None:
    """The outcome of an occurrence that cannot be picked up, or None."""
    if occurrence.status == "rejected":
        return _rejected(occurrence, occurrence.rejection_reason)
    if occurrence.status == "pending_review":
        return Outcome("pending", occurrence.occurrence_id, "Waiting for a reviewer's decision.")
    if occurrence.status == "revoked":
        return Outcome(
            "refused", occurrence.occurrence_id, "An admin revoked the approval; not run."
        )
    if occurrence.status == "timed_out":
        return Outcome(
            "timed_out",
            occurrence.occurrence_id,
            f"Nobody reviewed this call ({occurrence.tool}) before its deadline: it timed "
            "out and was not run. It was not rejected; propose it again to ask again.",
        )
    return None


def _expired(occurrence: Occurrence) -> bool:
    approval = occurrence.approval
    return occurrence.status == "expired" or (
        approval is not None and approval.state == "expired" and occurrence.status == "approved"
    )


Execute = Callable[[Mapping[str, Any], str], Any]
AsyncExecute = Callable[[Mapping[str, Any], str], Awaitable[Any]]


def run_decided(
    client: ApprovalConsole,
    occurrence: Occurrence,
    *,
    execution_id: str,
    execute: Execute,
    renew_expired: bool = True,
    effect_timeout: float = DEFAULT_EFFECT_TIMEOUT,
    proposed: Mapping[str, Any] | None = None,
    edit_notice: str | None = EDIT_NOTICE,
) -> Outcome:
    """Run ``execute(arguments, idempotency_key)`` for a decided occurrence, at most once;
    for a console-executed tool, wait up to ``effect_timeout`` seconds for its effect.
    ``proposed``: the arguments the model asked for, to name a reviewer's changes;
    ``edit_notice``: the last sentence of that note (None: no note)."""
    outcome = _run_decided(
        client,
        occurrence,
        execution_id=execution_id,
        execute=execute,
        renew_expired=renew_expired,
        effect_timeout=effect_timeout,
    )
    return with_edit(outcome, proposed, notice=edit_notice)


def _run_decided(
    client: ApprovalConsole,
    occurrence: Occurrence,
    *,
    execution_id: str,
    execute: Execute,
    renew_expired: bool,
    effect_timeout: float,
) -> Outcome:
    if (early := _not_decided(occurrence)) is not None:
        return early
    if occurrence.status == "auto_admitted":
        result = execute(occurrence.proposal.arguments, f"auto_{occurrence.occurrence_id}")
        return Outcome("executed", occurrence.occurrence_id, receipt_of(result), result=result)
    if _expired(occurrence) and _ours(occurrence, execution_id) is None:
        return _renew(client, occurrence, renew_expired)
    command_id = _ours(occurrence, execution_id)
    fresh = False
    if command_id is None:
        try:
            token = client.pickup(occurrence.occurrence_id, execution_id)
        except errors.AlreadyClaimed as exc:
            if exc.execution_id != execution_id or not exc.command_id:
                return _claimed_by_other(occurrence, exc.execution_id)
            command_id = exc.command_id
        except errors.Rejected as exc:
            return _rejected(occurrence, exc.reason)
        except errors.ApprovalExpired:
            return _renew(client, occurrence, renew_expired)
        except errors.NotApproved:
            # Edited (or renewed) after we read it: back in review.
            return _not_decided(client.get(occurrence.occurrence_id)) or Outcome(
                "pending", occurrence.occurrence_id, "Waiting for a reviewer's decision."
            )
        else:
            occurrence = client.get(occurrence.occurrence_id)
            try:
                claim = client.claim(
                    token,
                    tool=occurrence.tool,
                    arguments=occurrence.proposal.arguments,
                    execution_id=execution_id,
                )
            except errors.Replayed:
                # Another process resuming this same execution picked the token up again
                # (voiding this one) or claimed first: its outcome is this call's.
                return _sibling(client, occurrence, execution_id, effect_timeout)
            finally:
                del token
            command_id, fresh = claim.command_id, not claim.duplicate
    detail = client.command(command_id)
    if detail.executed_by == "console":
        return _by_console(occurrence, _console_effect(client, occurrence, detail, effect_timeout))
    if not fresh and not detail.settled:
        # Claimed by this execution before: another process resuming it may be running the
        # tool right now. Its report is the outcome; only when none comes in time is the
        # claimer taken for dead (a crash after the claim) and recovered below.
        _wait_settled(client, occurrence.occurrence_id, command_id, effect_timeout)
        detail = client.command(command_id)
    if (settled := _settled(occurrence, detail)) is not None:
        return settled
    if not fresh and client.tool(occurrence.tool).replay_safety not in REPLAY_SAFE:
        client.report_effect(
            command_id,
            execution_id=execution_id,
            outcome="outcome_unknown",
            detail="The runtime restarted after claiming; it cannot tell whether the call ran.",
        )
        return _settled(occurrence, client.command(command_id)) or _unknown(occurrence)
    try:
        result = execute(occurrence.proposal.arguments, detail.idempotency_key)
    except EffectRejected as exc:
        client.report_effect(
            command_id, execution_id=execution_id, outcome="rejected", detail=str(exc)[:2000]
        )
        return _refused(occurrence, command_id, exc)
    except Exception as exc:
        client.report_effect(
            command_id,
            execution_id=execution_id,
            outcome="outcome_unknown",
            detail=_unknown_detail(exc),
        )
        return _unknown(occurrence, command_id)
    client.report_effect(
        command_id, execution_id=execution_id, outcome="committed", receipt=receipt_of(result)
    )
    return _executed(occurrence, detail, result)


async def arun_decided(
    client: AsyncApprovalConsole,
    occurrence: Occurrence,
    *,
    execution_id: str,
    execute: AsyncExecute,
    renew_expired: bool = True,
    effect_timeout: float = DEFAULT_EFFECT_TIMEOUT,
    proposed: Mapping[str, Any] | None = None,
    edit_notice: str | None = EDIT_NOTICE,
) -> Outcome:
    """:func:`run_decided` for the async client and an async tool."""
    outcome = await _arun_decided(
        client,
        occurrence,
        execution_id=execution_id,
        execute=execute,
        renew_expired=renew_expired,
        effect_timeout=effect_timeout,
    )
    return with_edit(outcome, proposed, notice=edit_notice)


async def _arun_decided(
    client: AsyncApprovalConsole,
    occurrence: Occurrence,
    *,
    execution_id: str,
    execute: AsyncExecute,
    renew_expired: bool,
    effect_timeout: float,
) -> Outcome:
    if (early := _not_decided(occurrence)) is not None:
        return early
    if occurrence.status == "auto_admitted":
        result = await execute(occurrence.proposal.arguments, f"auto_{occurrence.occurrence_id}")
        return Outcome("executed", occurrence.occurrence_id, receipt_of(result), result=result)
    if _expired(occurrence) and _ours(occurrence, execution_id) is None:
        return await _arenew(client, occurrence, renew_expired)
    command_id = _ours(occurrence, execution_id)
    fresh = False
    if command_id is None:
        try:
            token = await client.pickup(occurrence.occurrence_id, execution_id)
        except errors.AlreadyClaimed as exc:
            if exc.execution_id != execution_id or not exc.command_id:
                return _claimed_by_other(occurrence, exc.execution_id)
            command_id = exc.command_id
        except errors.Rejected as exc:
            return _rejected(occurrence, exc.reason)
        except errors.ApprovalExpired:
            return await _arenew(client, occurrence, renew_expired)
        except errors.NotApproved:
            return _not_decided(await client.get(occurrence.occurrence_id)) or Outcome(
                "pending", occurrence.occurrence_id, "Waiting for a reviewer's decision."
            )
        else:
            occurrence = await client.get(occurrence.occurrence_id)
            try:
                claim = await client.claim(
                    token,
                    tool=occurrence.tool,
                    arguments=occurrence.proposal.arguments,
                    execution_id=execution_id,
                )
            except errors.Replayed:
                return await _asibling(client, occurrence, execution_id, effect_timeout)
            finally:
                del token
            command_id, fresh = claim.command_id, not claim.duplicate
    detail = await client.command(command_id)
    if detail.executed_by == "console":
        detail = await _aconsole_effect(client, occurrence, detail, effect_timeout)
        return _by_console(occurrence, detail)
    if not fresh and not detail.settled:
        # See run_decided: another process of this execution may be running the tool.
        with contextlib.suppress(errors.WaitTimeout):
            await client.watch(
                occurrence.occurrence_id,
                _settled_command(command_id),
                timeout=effect_timeout,
                what="without the command's effect",
            )
        detail = await client.command(command_id)
    if (settled := _settled(occurrence, detail)) is not None:
        return settled
    if not fresh and (await client.tool(occurrence.tool)).replay_safety not in REPLAY_SAFE:
        await client.report_effect(
            command_id,
            execution_id=execution_id,
            outcome="outcome_unknown",
            detail="The runtime restarted after claiming; it cannot tell whether the call ran.",
        )
        return _settled(occurrence, await client.command(command_id)) or _unknown(occurrence)
    try:
        result = await execute(occurrence.proposal.arguments, detail.idempotency_key)
    except EffectRejected as exc:
        await client.report_effect(
            command_id, execution_id=execution_id, outcome="rejected", detail=str(exc)[:2000]
        )
        return _refused(occurrence, command_id, exc)
    except Exception as exc:
        await client.report_effect(
            command_id,
            execution_id=execution_id,
            outcome="outcome_unknown",
            detail=_unknown_detail(exc),
        )
        return _unknown(occurrence, command_id)
    await client.report_effect(
        command_id, execution_id=execution_id, outcome="committed", receipt=receipt_of(result)
    )
    return _executed(occurrence, detail, result)


def _unknown(occurrence: Occurrence, command_id: str | None = None) -> Outcome:
    return Outcome(
        "outcome_unknown",
        occurrence.occurrence_id,
        f"Whether {occurrence.tool} took effect is unknown; an operator will reconcile it. "
        "Do not retry it.",
        command_id=command_id,
        arguments=occurrence.proposal.arguments,
        edited_by=occurrence.proposal.edited_by,
    )


def _refused(occurrence: Occurrence, command_id: str, exc: EffectRejected) -> Outcome:
    return Outcome(
        "failed",
        occurrence.occurrence_id,
        f"{occurrence.tool} was refused before it took effect: {sentence(str(exc))}",
        command_id=command_id,
        reason=str(exc),
        arguments=occurrence.proposal.arguments,
        edited_by=occurrence.proposal.edited_by,
    )


def _sibling_done(execution_id: str) -> Callable[[Occurrence], bool]:
    """This execution's command has its effect, or another execution consumed the approval."""

    def done(occurrence: Occurrence) -> bool:
        approval = occurrence.approval
        if approval is not None and approval.consumed_by_execution not in (None, execution_id):
            return True
        return any(
            c.execution_id == execution_id and c.effect_state in SETTLED_EFFECTS
            for c in occurrence.commands
        )

    return done


def _sibling_outcome(
    occurrence: Occurrence, current: Occurrence | None, detail: CommandDetail | None
) -> Outcome:
    """What the process that won this execution's claim reported (never reported here)."""
    if current is None or detail is None:
        return Outcome(
            "executing",
            occurrence.occurrence_id,
            f"Another process of this run is executing {occurrence.tool} for this call; its "
            "outcome is not known yet. Do not retry it and do not tell the user it is done.",
            arguments=occurrence.proposal.arguments,
            edited_by=occurrence.proposal.edited_by,
        )
    if detail.executed_by == "console":
        return _by_console(current, detail)
    return _settled(current, detail) or _unknown(current, detail.command_id)


def _sibling(
    client: ApprovalConsole, occurrence: Occurrence, execution_id: str, timeout: float
) -> Outcome:
    """Wait (at most ``timeout``) for the outcome of the process that claimed for this
    execution; run nothing and report nothing here."""
    try:
        current = client.watch(
            occurrence.occurrence_id,
            _sibling_done(execution_id),
            timeout=timeout,
            what="without this execution's effect",
        )
    except errors.WaitTimeout:
        return _sibling_outcome(occurrence, None, None)
    command_id = _ours(current, execution_id)
    if command_id is None:
        other = current.approval.consumed_by_execution if current.approval else None
        return _claimed_by_other(current, other)
    return _sibling_outcome(occurrence, current, client.command(command_id))


async def _asibling(
    client: AsyncApprovalConsole, occurrence: Occurrence, execution_id: str, timeout: float
) -> Outcome:
    try:
        current = await client.watch(
            occurrence.occurrence_id,
            _sibling_done(execution_id),
            timeout=timeout,
            what="without this execution's effect",
        )
    except errors.WaitTimeout:
        return _sibling_outcome(occurrence, None, None)
    command_id = _ours(current, execution_id)
    if command_id is None:
        other = current.approval.consumed_by_execution if current.approval else None
        return _claimed_by_other(current, other)
    return _sibling_outcome(occurrence, current, await client.command(command_id))


def _claimed_by_other(occurrence: Occurrence, execution_id: str | None) -> Outcome:
    return Outcome(
        "refused",
        occurrence.occurrence_id,
        f"Another execution ({execution_id}) already claimed this approval; not run here.",
    )


def _renewed(occurrence: Occurrence) -> Outcome:
    return Outcome(
        "renewed",
        occurrence.occurrence_id,
        "The approval expired before it was used; the call went back to review.",
    )


def _expired_outcome(occurrence: Occurrence) -> Outcome:
    return Outcome("refused", occurrence.occurrence_id, "The approval expired before it was used.")


def _renew(client: ApprovalConsole, occurrence: Occurrence, allowed: bool) -> Outcome:
    if not allowed:
        return _expired_outcome(occurrence)
    # NotRenewable: renewed meanwhile (pending_review) by another worker of this run.
    with contextlib.suppress(errors.NotRenewable):
        client.renew(occurrence.occurrence_id)
    return _renewed(occurrence)


async def _arenew(client: AsyncApprovalConsole, occurrence: Occurrence, allowed: bool) -> Outcome:
    if not allowed:
        return _expired_outcome(occurrence)
    with contextlib.suppress(errors.NotRenewable):
        await client.renew(occurrence.occurrence_id)
    return _renewed(occurrence)
