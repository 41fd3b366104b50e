"""Delivering a command to its adapter in atomic phases.

1. Under the command's row lock, decide what this delivery may do and record it: an
   ``AdapterInvocation`` row and the effect ``sending`` are committed *before* the call.
2. Call the adapter outside any transaction.
3. Record the result with a guarded update and its audit event.

Every boundary is a place a worker can die (``reconciliation.faults``). A delivery that
finds the command past ``pending`` calls nothing and records the redelivery; one that
finds ``sending`` (a worker died mid-call) calls again only under a justification the
tool contract gives (query the effect first, or the same key again), otherwise it stops
at ``outcome_unknown`` for an operator.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import transaction
from django.db.models import Count, Max, Q

from approvals import metrics
from approvals.audit.record import DbNow, audit_record, db_now
from approvals.models import Command, Epoch, ToolContract
from approvals.vocabulary import AuditKind, EventDecision, EventReason
from reconciliation import adapters
from reconciliation.adapters.base import (
    Call,
    Committed,
    Interrupted,
    NotFound,
    Rejected,
    Unknown,
)
from reconciliation.faults import crash_point
from reconciliation.models import AdapterInvocation, Interruption
from reconciliation.results import describe, detail_of, outcome_of

log = structlog.get_logger("reconciliation")


# What is known when a later delivery finds a call unfinished: its worker died, or the
# broker handed the message on while the call was still running.
_ABANDONED = (
    "a later delivery found this call unfinished "
    "(its worker died, or the call outlived the visibility timeout)"
)


class Why(enum.StrEnum):
    """Why an invocation was allowed: recorded on every row."""

    FIRST_DELIVERY = "first_delivery"
    # Earlier calls of this epoch were refused before execution (nothing happened).
    REFUSED_BEFORE_EXECUTION = "refused_before_execution"
    # The effect query found no effect under the key, so nothing happened.
    QUERIED_NOT_FOUND = "queried_not_found"
    # The contract's replay safety, for a call whose first attempt may have happened.
    EFFECT_QUERYABLE = "effect_queryable"
    IDEMPOTENT_WITH_KEY = "idempotent_with_key"
    READ_ONLY = "read_only"
    # A later epoch's first delivery: the admission recorded why.
    EPOCH_ADMITTED = "epoch_admitted"


@dataclass(frozen=True)
class Plan:
    """What the current phase decided: an invocation to perform, or nothing. With an
    invocation, the call as read under the command's lock and the adapter's name, so that
    the call itself reads nothing of the command again."""

    command_id: uuid.UUID
    invocation: AdapterInvocation | None = None
    # Seconds until this command should be delivered again (a momentary refusal).
    retry_in: float | None = None
    note: str = ""
    call: Call | None = None
    adapter: str = ""


def _plan(command: Command, invocation: AdapterInvocation) -> Plan:
    return Plan(
        command.pk, invocation, call=call_of(command), adapter=command.occurrence.tool.adapter
    )


@dataclass(frozen=True)
class History:
    """What a delivery needs to know of the command's earlier invocations, read at once."""

    last: int  # the newest invocation's number (0: none yet)
    attempts: int  # calls made under the current epoch
    open: int  # invocations never finished (a worker died in the call)


def _history(command: Command, epoch: Epoch) -> History:
    found = command.invocations.aggregate(
        last=Max("number"),
        attempts=Count("pk", filter=Q(epoch=epoch, kind=AdapterInvocation.Kind.EXECUTE)),
        open=Count("pk", filter=Q(finished_at__isnull=True)),
    )
    return History(found["last"] or 0, found["attempts"], found["open"])


def call_of(command: Command) -> Call:
    proposal = command.approval.proposal if command.approval else None
    arguments: dict[str, Any] = proposal.arguments if proposal else {}
    return Call(
        command_id=str(command.pk),
        idempotency_key=command.idempotency_key,
        tool=command.occurrence.tool.name,
        arguments=arguments,
        tenant_id=command.tenant_id,
    )


def _lock(command_id: uuid.UUID | str) -> Command | None:
    return (
        Command.objects.select_for_update(of=("self",))
        .select_related("occurrence__tool", "approval__proposal")
        .filter(pk=command_id)
        .first()
    )


def current_epoch(command: Command) -> Epoch:
    """The occurrence's newest epoch: the one this command is being delivered under."""
    return Epoch.objects.filter(occurrence_id=command.occurrence_id).order_by(
        "-number"
    ).first() or (command.epoch)


def _audit(command: Command, kind: AuditKind, *, message_id: str = "", **fields: Any) -> None:
    data = fields.pop("data", {})
    audit_record(
        kind=kind,
        tenant=command.tenant_id,
        occurrence=command.occurrence_id,
        actor="worker",
        command_id=command.pk,
        message_id=message_id,
        execution_id=fields.pop("execution_id", command.execution_id),
        data=data,
        **fields,
    )


def invocation_open(
    command: Command,
    *,
    kind: str,
    justification: str,
    message_id: str = "",
    epoch: Epoch | None = None,
    last: int | None = None,
    now: datetime | None = None,
) -> AdapterInvocation:
    """The command's next invocation row, under the current epoch; call it under the
    command's row lock, in the transaction that commits before the call is made. A caller
    that read the epoch, the last number or the clock already passes them."""
    if last is None:
        last = command.invocations.aggregate(n=Max("number"))["n"] or 0
    return AdapterInvocation.objects.create(
        command=command,
        epoch=epoch or current_epoch(command),
        number=last + 1,
        kind=kind,
        justification=justification,
        message_id=message_id,
        started_at=now or db_now(),
    )


def _start(
    command: Command,
    epoch: Epoch,
    history: History,
    *,
    kind: str,
    why: str,
    message_id: str,
    expect: str,
) -> AdapterInvocation:
    """Commit the invocation row (and the effect ``sending``) before anything is called."""
    now = db_now()
    if history.open:
        # A row left unfinished by a worker that died is closed as abandoned: it happened,
        # and its outcome is whatever the evidence later says, not nothing.
        command.invocations.filter(finished_at__isnull=True).update(
            finished_at=now, outcome=AdapterInvocation.Outcome.ABANDONED, detail=_ABANDONED
        )
    invocation = invocation_open(
        command,
        kind=kind,
        justification=why,
        message_id=message_id,
        epoch=epoch,
        last=history.last,
        now=now,
    )
    metrics.dispatch_started(command, invocation.number, now)
    if expect != Command.State.SENDING:
        moved = Command.objects.filter(pk=command.pk, state=expect).update(
            state=Command.State.SENDING, updated_at=now
        )
        assert moved == 1, "the row lock guarantees the state read under it"
        _audit(
            command,
            AuditKind.EFFECT_SENDING,
            message_id=message_id,
            execution_id=epoch.execution_id,
            decision=Command.State.SENDING,
            reason_code=why,
            data={"invocation": invocation.number, "epoch": epoch.number, "kind": kind},
        )
    return invocation


def begin(*, command_id: uuid.UUID | str, message_id: str = "") -> Plan:
    """Phase 1: decide what this delivery does, and commit that decision."""
    with transaction.atomic():
        command = _lock(command_id)
        if command is None:
            log.warning("dispatch.unknown_command", command_id=str(command_id))
            return Plan(uuid.UUID(str(command_id)), note="no such command")
        contract = command.occurrence.tool
        pk = command.pk
        if command.executed_by != Command.ExecutedBy.CONSOLE:
            return Plan(pk, note="executed by the runtime")
        if command.state not in (Command.State.PENDING, Command.State.SENDING):
            # Past sending: this is a redelivery of a message whose work is done.
            _audit(
                command,
                AuditKind.DISPATCH_REDELIVERED,
                message_id=message_id,
                decision=EventDecision.IGNORED,
                reason_code=EventReason.already(command.state),
                data={"state": command.state},
            )
            return Plan(pk, note=f"redelivery: already {command.state}")

        epoch = current_epoch(command)
        history = _history(command, epoch)
        if command.state == Command.State.PENDING:
            if history.attempts >= contract.max_attempts:
                # A sweep found a pending command whose retries are spent.
                _settle(
                    command,
                    epoch,
                    None,
                    Command.State.REJECTED,
                    message_id=message_id,
                    data={"why": f"{history.attempts} calls were refused before execution"},
                )
                return Plan(pk, note="attempts exhausted")
            if history.attempts:
                why = Why.REFUSED_BEFORE_EXECUTION
            elif epoch.number > 1:
                why = Why.EPOCH_ADMITTED
            else:
                why = Why.FIRST_DELIVERY
            invocation = _start(
                command,
                epoch,
                history,
                kind=AdapterInvocation.Kind.EXECUTE,
                why=why,
                message_id=message_id,
                expect=Command.State.PENDING,
            )
            return _plan(command, invocation)

        # Sending: the previous delivery's worker died, or is still in the call: either
        # way a call may be in flight, and only the contract can justify another.
        safety = contract.replay_safety
        if safety == ToolContract.ReplaySafety.EFFECT_QUERYABLE:
            invocation = _start(
                command,
                epoch,
                history,
                kind=AdapterInvocation.Kind.QUERY,
                why=Why.EFFECT_QUERYABLE,
                message_id=message_id,
                expect=Command.State.SENDING,
            )
            return _plan(command, invocation)
        attempts_left = history.attempts < contract.max_attempts
        if (
            safety
            in (
                ToolContract.ReplaySafety.IDEMPOTENT_WITH_KEY,
                ToolContract.ReplaySafety.READ_ONLY,
            )
            and attempts_left
        ):
            why = (
                Why.IDEMPOTENT_WITH_KEY
                if safety == ToolContract.ReplaySafety.IDEMPOTENT_WITH_KEY
                else Why.READ_ONLY
            )
            invocation = _start(
                command,
                epoch,
                history,
                kind=AdapterInvocation.Kind.EXECUTE,
                why=why,
                message_id=message_id,
                expect=Command.State.SENDING,
            )
            return _plan(command, invocation)
        command.invocations.filter(finished_at__isnull=True).update(
            finished_at=DbNow(),
            outcome=AdapterInvocation.Outcome.ABANDONED,
            detail=_ABANDONED,
        )
        _settle(
            command,
            epoch,
            None,
            Command.State.OUTCOME_UNKNOWN,
            message_id=message_id,
            data={
                "why": "a delivery found the command sending: the call may have reached "
                f"the remote, and the contract ({safety}) allows no second call. "
                "An operator must reconcile it."
            },
        )
        return Plan(pk, note="stopped: outcome unknown")


def _settle(
    command: Command,
    epoch: Epoch,
    invocation: AdapterInvocation | None,
    state: str,
    *,
    message_id: str = "",
    receipt: str = "",
    data: dict[str, Any] | None = None,
    reason_code: str = "",
) -> None:
    """A guarded transition of the effect to ``state``, with its audit event. Called under
    the command's row lock, with the occurrence's current epoch."""
    moved = Command.objects.filter(pk=command.pk, state=command.state).update(
        state=state, updated_at=DbNow()
    )
    assert moved == 1, "the row lock guarantees the state read under it"
    event_data = {**(data or {})}
    if invocation is not None:
        event_data["invocation"] = invocation.number
    if receipt:
        event_data["receipt"] = receipt
    _audit(
        command,
        AuditKind.for_effect(state),
        message_id=message_id,
        execution_id=epoch.execution_id,
        decision=state,
        reason_code=reason_code,
        data=event_data,
    )
    command.state = state


def _finish(invocation: AdapterInvocation, result: Any) -> bool:
    """Close the invocation with what the call returned, unless another delivery closed it
    meanwhile (gave it up as abandoned): whether this one did."""
    closed = AdapterInvocation.objects.filter(pk=invocation.pk, finished_at__isnull=True).update(
        finished_at=DbNow(),
        outcome=outcome_of(result),
        receipt=getattr(result, "receipt", "")[:200],
        detail=detail_of(result),
    )
    return closed == 1


def _backoff(contract: ToolContract, attempts: int) -> float:
    base: timedelta = contract.retry_backoff
    return float(base.total_seconds() * (2 ** max(attempts - 1, 0)))


def record(plan: Plan, result: Any) -> Plan:
    """Phase 3: record what the call returned, under the row lock, guarded by the state
    the call started from. May return the next invocation (an effect query after an
    unknown outcome; a second call after the query found nothing)."""
    invocation = plan.invocation
    assert invocation is not None
    with transaction.atomic():
        command = _lock(plan.command_id)
        assert command is not None
        contract = command.occurrence.tool
        if command.state != Command.State.SENDING or not _finish(invocation, result):
            # Another delivery settled the effect (or gave this call up) meanwhile: the
            # answer is still evidence, kept on the row and in the audit trail.
            _late(command, invocation, result)
            return Plan(command.pk, note="late result")

        epoch = current_epoch(command)
        if isinstance(result, Committed):
            why = (
                "the effect query found it"
                if invocation.kind == AdapterInvocation.Kind.QUERY
                else "the remote confirmed it"
            )
            _settle(
                command,
                epoch,
                invocation,
                Command.State.COMMITTED,
                message_id=invocation.message_id,
                receipt=result.receipt,
                reason_code=invocation.justification,
                data={"why": why},
            )
            return Plan(command.pk)

        if isinstance(result, NotFound):
            history = _history(command, epoch)
            if history.attempts >= contract.max_attempts:
                _settle(
                    command,
                    epoch,
                    invocation,
                    Command.State.OUTCOME_UNKNOWN,
                    message_id=invocation.message_id,
                    reason_code=EventReason.ATTEMPTS_EXHAUSTED,
                    data={"why": "no effect under the key, and no attempt is left"},
                )
                return Plan(command.pk)
            nxt = _start(
                command,
                epoch,
                history,
                kind=AdapterInvocation.Kind.EXECUTE,
                why=Why.QUERIED_NOT_FOUND,
                message_id=invocation.message_id,
                expect=Command.State.SENDING,
            )
            return _plan(command, nxt)

        if isinstance(result, Interrupted):
            interruption = Interruption.objects.create(
                command=command,
                epoch=epoch,
                invocation=invocation,
                kind=Interruption.Kind.AUTH_CHALLENGE,
                challenges=list(result.challenges),
                detail=result.detail,
            )
            # A 401 is the remote refusing before execution: the effect is known rejected.
            _settle(
                command,
                epoch,
                invocation,
                Command.State.REJECTED,
                message_id=invocation.message_id,
                reason_code=EventReason.AUTH_CHALLENGE,
                data={
                    "why": "the remote asked for authentication",
                    "interruption": interruption.pk,
                },
            )
            _audit(
                command,
                AuditKind.RECOVERY_INTERRUPTED,
                message_id=invocation.message_id,
                execution_id=epoch.execution_id,
                decision=EventDecision.INTERRUPTED,
                reason_code=Interruption.Kind.AUTH_CHALLENGE,
                data={
                    "interruption": interruption.pk,
                    "challenges": list(result.challenges),
                    "epoch": epoch.number,
                },
            )
            return Plan(command.pk, note="interrupted")

        if isinstance(result, Rejected):
            attempts = _history(command, epoch).attempts
            if result.retryable and attempts < contract.max_attempts:
                delay = _backoff(contract, attempts)
                # Nothing happened, so the command goes back to the outbox.
                Command.objects.filter(pk=command.pk, state=Command.State.SENDING).update(
                    state=Command.State.PENDING, updated_at=DbNow()
                )
                _audit(
                    command,
                    AuditKind.EFFECT_RETRY_SCHEDULED,
                    message_id=invocation.message_id,
                    execution_id=epoch.execution_id,
                    decision=Command.State.PENDING,
                    reason_code=Why.REFUSED_BEFORE_EXECUTION,
                    data={
                        "invocation": invocation.number,
                        "why": result.reason,
                        "attempt": attempts,
                        "of": contract.max_attempts,
                        "retry_in_seconds": delay,
                    },
                )
                return Plan(command.pk, retry_in=delay)
            _settle(
                command,
                epoch,
                invocation,
                Command.State.REJECTED,
                message_id=invocation.message_id,
                reason_code=EventReason.REFUSED_BEFORE_EXECUTION,
                data={"why": result.reason},
            )
            return Plan(command.pk)

        assert isinstance(result, Unknown)
        if (
            contract.replay_safety == ToolContract.ReplaySafety.EFFECT_QUERYABLE
            and invocation.kind == AdapterInvocation.Kind.EXECUTE
        ):
            # Ask before anything else: the remote knows whether the effect exists.
            nxt = _start(
                command,
                epoch,
                _history(command, epoch),
                kind=AdapterInvocation.Kind.QUERY,
                why=Why.EFFECT_QUERYABLE,
                message_id=invocation.message_id,
                expect=Command.State.SENDING,
            )
            return _plan(command, nxt)
        _settle(
            command,
            epoch,
            invocation,
            Command.State.OUTCOME_UNKNOWN,
            message_id=invocation.message_id,
            reason_code=EventReason.AMBIGUOUS,
            data={"why": result.why},
        )
        return Plan(command.pk)


def _late(command: Command, invocation: AdapterInvocation, result: Any) -> None:
    """An answer that came after the effect was settled, or after another delivery gave
    its call up: added to the invocation's row and to the audit trail."""
    fresh = AdapterInvocation.objects.get(pk=invocation.pk)
    detail = f"arrived after the effect was {command.state}: {describe(result)}"
    AdapterInvocation.objects.filter(pk=invocation.pk).update(
        detail=(fresh.detail + "; " if fresh.detail else "") + detail,
        receipt=getattr(result, "receipt", "")[:200] or fresh.receipt,
    )
    _audit(
        command,
        AuditKind.EFFECT_LATE_RESULT,
        message_id=invocation.message_id,
        reason_code=outcome_of(result),
        data={"invocation": invocation.number, "result": describe(result)},
    )


def perform(plan: Plan) -> Any:
    """Phase 2: the call itself, outside any transaction, as phase 1 read it."""
    invocation, call = plan.invocation, plan.call
    assert invocation is not None and call is not None
    adapter = adapters.adapter_for(plan.adapter, tenant_id=call.tenant_id)
    if adapter is None:
        return Rejected(f"the console has no adapter named {plan.adapter!r}")
    if invocation.kind == AdapterInvocation.Kind.QUERY:
        return adapter.query_effect(call)
    return adapter.execute(call)


def command_dispatch(*, command_id: uuid.UUID | str, message_id: str = "") -> Plan:
    """Deliver one command: the phases in order, until nothing is left to call.

    Returns the last plan; its ``retry_in`` asks the caller to deliver again later."""
    plan = begin(command_id=command_id, message_id=message_id)
    while plan.invocation is not None:
        crash_point("before_call", str(plan.command_id))
        result = perform(plan)
        crash_point("after_call", str(plan.command_id))
        plan = record(plan, result)
    return plan
