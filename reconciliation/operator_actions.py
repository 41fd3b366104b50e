"""Operator decisions about a command's effect: each one explicit, named and recorded, and
refused when the state no longer allows it or is no longer the one the operator's page
showed (under the command's lock: of two operators at once, one wins and the other is
told what happened). An operator's own call to the adapter (an effect query, a
compensation) is made like a delivery's: its invocation committed before the call, its
answer recorded whatever is then decided, and one compensation out at a time.

Nothing here re-uses an approval: a decision that allows another attempt admits a new
epoch of the occurrence (``reconciliation.epochs.epoch_admit``) and names itself as the
reason; the approval stays consumed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from approvals.audit.record import audit_record, db_now
from approvals.errors import ErrorCode, ServiceError
from approvals.models import Command, Epoch
from approvals.vocabulary import AuditKind
from reconciliation import adapters
from reconciliation.action_rules import ALLOWED_FROM, finding_refusal
from reconciliation.adapters.base import Committed, NotFound, Rejected, Unknown
from reconciliation.dispatch import call_of, current_epoch, invocation_open
from reconciliation.epochs import command_lock, epoch_admit, last_finding
from reconciliation.models import AdapterInvocation, OperatorDecision
from reconciliation.results import describe, outcome_of
from reconciliation.takes import take_release_on_resolve

# Invocations whose receipt names the effect under the command's key (a compensation's
# names its reversal).
_EFFECT_KINDS = (AdapterInvocation.Kind.EXECUTE, AdapterInvocation.Kind.QUERY)


class Refused(ServiceError):
    """The command's state no longer allows the action."""


@dataclass(frozen=True)
class Done:
    decision: OperatorDecision
    message: str
    epoch: Epoch | None = None


def _require_note(note: str) -> str:
    note = (note or "").strip()
    if not note:
        raise ServiceError(
            ErrorCode.NOTE_REQUIRED, "Write a note: it is recorded with the decision.", 422
        )
    return note


def _lock(command_id: Any) -> Command:
    command = command_lock(command_id)
    if command is None:
        raise ServiceError(ErrorCode.NOT_FOUND, "No such command.", 404)
    return command


def seen_state(state: str, epoch_number: int) -> str:
    """What an operator's form says its page showed: the effect and the epoch. Together
    they change with every move: an accepted ambiguity whose new delivery ends unknown
    again leaves the same effect in another epoch."""
    return f"{state}:{epoch_number}"


_SEEN_STATE = re.compile(r"[a-z_]{1,32}:[0-9]{1,9}")


def _refuse_unless(command: Command, action: str, seen: str | None = None) -> None:
    """Refuse an action the state no longer allows, or one decided on a page that showed
    another state (``seen``, from ``seen_state``; None: the caller showed nothing)."""
    if seen:
        if not _SEEN_STATE.fullmatch(seen):
            raise ServiceError(
                ErrorCode.SEEN_STATE_INVALID,
                "The form did not say which state it was shown: reload the page and decide again.",
                422,
            )
        epoch = current_epoch(command).number
        if seen != seen_state(command.state, epoch):
            raise Refused(
                ErrorCode.STATE_CHANGED,
                f"Refused: the effect is now {command.get_state_display().lower()} (epoch "
                f"{epoch}), not what your page showed when you decided. Nothing was "
                "recorded: look at it as it is now and decide again.",
                409,
            )
    if command.state not in ALLOWED_FROM[action]:
        raise Refused(
            ErrorCode.STATE_CHANGED,
            f"Refused: the effect is now {command.get_state_display().lower()}, which does "
            f"not allow “{OperatorDecision.Action(action).label.lower()}”. Nothing was recorded.",
            409,
        )


def _detail(result: Any) -> str:
    if isinstance(result, Rejected):
        return result.reason
    if isinstance(result, Unknown):
        return result.why
    return str(getattr(result, "detail", ""))


def _answer_keep(invocation: AdapterInvocation, result: Any) -> None:
    """Record an operator's call's answer on its invocation. A row closed meanwhile (a
    delivery, or a later compensation, found it unfinished and gave it up) keeps that
    outcome; the answer is added to its detail, as a worker's late result is."""
    receipt = result.receipt[:200] if isinstance(result, Committed) else ""
    open_row = AdapterInvocation.objects.filter(pk=invocation.pk, finished_at__isnull=True)
    closed = open_row.update(
        finished_at=db_now(),
        outcome=outcome_of(result),
        receipt=receipt,
        detail=_detail(result),
    )
    if not closed:
        fresh = AdapterInvocation.objects.get(pk=invocation.pk)
        late = f"the answer arrived after the call was given up: {describe(result)}"
        AdapterInvocation.objects.filter(pk=invocation.pk).update(
            detail=(fresh.detail + "; " if fresh.detail else "") + late,
            receipt=fresh.receipt or receipt,
        )


def _after_call(
    command_id: Any,
    invocation: AdapterInvocation,
    result: Any,
    decide: Callable[[Command], Done],
) -> Done:
    """The last phase of an operator's call: under the command's lock, the answer recorded
    on its invocation, then ``decide``. A refusal ``decide`` raises (the effect moved
    meanwhile, the remote did not confirm) takes back only its own writes and is raised
    after the answer is committed: the answer is kept, as the refusal says, and no row is
    left open for a later delivery to close as abandoned ("its worker died").

    One transaction for both, not the answer first on its own: a call that looked finished
    while its effect was still undecided would let a second compensation through."""
    refusal: ServiceError | None = None
    with transaction.atomic():
        command = _lock(command_id)
        _answer_keep(invocation, result)
        try:
            with transaction.atomic():
                done = decide(command)
        except ServiceError as exc:
            refusal = exc
    if refusal is not None:
        raise refusal
    return done


# What is known of a compensation call found unfinished past OPERATIONS_STUCK_SECONDS: the
# request that made it is gone (a web request lives no longer than the server's timeout).
_COMPENSATION_GIVEN_UP = (
    "a later compensation found this call unfinished: the request that made it died; "
    "whether the remote reversed the effect is what its records say"
)


def _refuse_while_compensating(command: Command) -> None:
    """One compensation call at a time: while an adapter compensation of the command is
    out, another (by the adapter or by hand) is refused with the state as it stands. Its
    open invocation row, committed before the call, is what says so, as ``sending`` does
    for a delivery; the effect itself stays what it is (committed) until the answer.

    A row older than ``OPERATIONS_STUCK_SECONDS`` belongs to a request that died: it is
    closed as abandoned, so that the effect can still be compensated."""
    call = (
        AdapterInvocation.objects.filter(
            command=command, kind=AdapterInvocation.Kind.COMPENSATE, finished_at__isnull=True
        )
        .order_by("-number")
        .first()
    )
    if call is None:
        return
    now = db_now()
    if call.started_at > now - timedelta(seconds=settings.OPERATIONS_STUCK_SECONDS):
        raise Refused(
            ErrorCode.COMPENSATION_IN_PROGRESS,
            "Refused: a compensation of this effect is already in progress (invocation "
            f"{call.number}, started {call.started_at.astimezone(UTC):%H:%M:%S} UTC); its "
            "answer will show here. The effect is still "
            f"{command.get_state_display().lower()}. Nothing was recorded.",
            409,
        )
    AdapterInvocation.objects.filter(pk=call.pk, finished_at__isnull=True).update(
        finished_at=now, outcome=AdapterInvocation.Outcome.ABANDONED, detail=_COMPENSATION_GIVEN_UP
    )


def _record(
    command: Command,
    *,
    action: str,
    operator: str,
    note: str,
    state_after: str,
    finding: str = "",
    evidence: str = "",
    data: dict[str, Any] | None = None,
) -> OperatorDecision:
    """The decision row, the guarded move of the effect, and the audit event, under the
    command's row lock."""
    before = command.state
    if state_after != before:
        moved = Command.objects.filter(pk=command.pk, state=before).update(
            state=state_after, updated_at=db_now()
        )
        assert moved == 1, "the row lock guarantees the state read under it"
    decision = OperatorDecision.objects.create(
        command=command,
        action=action,
        finding=finding,
        evidence=evidence[:500],
        note=note,
        operator=operator,
        state_before=before,
        state_after=state_after,
    )
    audit_record(
        kind=AuditKind.for_operator(action),
        tenant=command.tenant_id,
        occurrence=command.occurrence_id,
        actor=operator,
        decision=finding or action,
        reason_code=action,
        execution_id=current_epoch(command).execution_id,
        command_id=command.pk,
        data={
            "decision": decision.pk,
            "finding": finding,
            "evidence": evidence,
            "note": note,
            "state_before": before,
            "state_after": state_after,
            **(data or {}),
        },
    )
    # A decision that settles something (a finding, a moved effect, a new epoch) resolves
    # the item: whoever was on it is let go. A query that could not tell resolves nothing.
    if finding or state_after != before or action != OperatorDecision.Action.QUERY_EFFECT:
        take_release_on_resolve(
            occurrence_id=command.occurrence_id,
            tenant_id=command.tenant_id,
            operator=operator,
            decision=decision.pk,
        )
    command.state = state_after
    return decision


def command_query_effect(
    *, command_id: Any, operator: str, note: str, seen: str | None = None
) -> Done:
    """Ask the adapter whether the effect exists under the command's key, and record the
    answer as effect evidence: committed (with the receipt), or not found."""
    note = _require_note(note)
    with transaction.atomic():
        command = _lock(command_id)
        _refuse_unless(command, OperatorDecision.Action.QUERY_EFFECT, seen)
        adapter = adapters.adapter_for(command.occurrence.tool.adapter, tenant_id=command.tenant_id)
        if adapter is None or not adapter.can_query:
            raise ServiceError(
                ErrorCode.CANNOT_QUERY,
                "This tool's adapter cannot be asked about an effect: reconcile it by hand.",
                409,
            )
        invocation = invocation_open(
            command, kind=AdapterInvocation.Kind.QUERY, justification="operator_query"
        )
        state_asked = command.state
        call = call_of(command)
    # The question goes out outside any transaction, like every adapter call.
    result = adapter.query_effect(call)

    def decide(command: Command) -> Done:
        if command.state != state_asked:
            raise Refused(
                ErrorCode.STATE_CHANGED,
                f"The effect changed to {command.get_state_display().lower()} while the "
                "adapter was asked; its answer is kept on the invocation, nothing else.",
                409,
            )
        receipt = result.receipt if isinstance(result, Committed) else ""
        detail = _detail(result)
        if isinstance(result, Committed):
            decision = _record(
                command,
                action=OperatorDecision.Action.QUERY_EFFECT,
                operator=operator,
                note=note,
                finding=OperatorDecision.Finding.COMMITTED,
                evidence=receipt,
                state_after=Command.State.COMMITTED,
                data={"receipt": receipt, "invocation": invocation.number},
            )
            return Done(decision, f"The adapter found the effect: committed, receipt {receipt}.")
        if isinstance(result, NotFound):
            decision = _record(
                command,
                action=OperatorDecision.Action.QUERY_EFFECT,
                operator=operator,
                note=note,
                finding=OperatorDecision.Finding.NOT_COMMITTED,
                evidence=detail,
                state_after=Command.State.RECONCILED,
                data={"invocation": invocation.number},
            )
            return Done(
                decision,
                "The adapter has no effect under this key: reconciled as not committed. "
                "A retry is now justified.",
            )
        decision = _record(
            command,
            action=OperatorDecision.Action.QUERY_EFFECT,
            operator=operator,
            note=note,
            state_after=command.state,
            evidence=detail,
            data={"invocation": invocation.number, "answer": detail},
        )
        return Done(decision, f"The adapter could not tell: {detail}. Nothing changed.")

    return _after_call(command_id, invocation, result, decide)


def command_reconcile(
    *,
    command_id: Any,
    operator: str,
    note: str,
    outcome: str,
    evidence: str,
    seen: str | None = None,
) -> Done:
    """Record by hand, with evidence, that the effect is committed or not."""
    note = _require_note(note)
    evidence = (evidence or "").strip()
    if outcome not in (OperatorDecision.Finding.COMMITTED, OperatorDecision.Finding.NOT_COMMITTED):
        raise ServiceError(ErrorCode.OUTCOME_REQUIRED, "Choose committed or not committed.", 422)
    if not evidence:
        raise ServiceError(
            ErrorCode.EVIDENCE_REQUIRED, "Give the evidence: a receipt id or a link.", 422
        )
    with transaction.atomic():
        command = _lock(command_id)
        _refuse_unless(command, OperatorDecision.Action.RECONCILE, seen)
        decision = _record(
            command,
            action=OperatorDecision.Action.RECONCILE,
            operator=operator,
            note=note,
            finding=outcome,
            evidence=evidence,
            state_after=Command.State.RECONCILED,
        )
    label = "committed" if outcome == OperatorDecision.Finding.COMMITTED else "not committed"
    return Done(decision, f"Reconciled as {label}.")


def _admit(command: Command, decision: OperatorDecision, operator: str, note: str) -> Epoch:
    return epoch_admit(
        command=command,
        execution_id=f"operator-epoch-{decision.pk}",
        decided_by=operator,
        reason=note,
        decision=decision,
    )


def command_accept_ambiguity(
    *, command_id: Any, operator: str, note: str, seen: str | None = None
) -> Done:
    """The operator states that a duplicate is possible and accepted: a new epoch is
    admitted, linked to this decision, and the command is delivered again (same key)."""
    note = _require_note(note)
    with transaction.atomic():
        command = _lock(command_id)
        _refuse_unless(command, OperatorDecision.Action.ACCEPT_AMBIGUITY, seen)
        decision = _record(
            command,
            action=OperatorDecision.Action.ACCEPT_AMBIGUITY,
            operator=operator,
            note=note,
            state_after=command.state,
        )
        epoch = _admit(command, decision, operator, note)
    if command.executed_by == Command.ExecutedBy.RUNTIME:
        return Done(
            decision,
            f"Ambiguity accepted: epoch {epoch.number} is admitted and the runtime that "
            "executes this command is told to run it again; it waits in the queue until the "
            "runtime reports.",
            epoch,
        )
    return Done(
        decision,
        f"Ambiguity accepted: epoch {epoch.number} is admitted and the command is delivered "
        "again under the same key.",
        epoch,
    )


def command_retry(*, command_id: Any, operator: str, note: str, seen: str | None = None) -> Done:
    """Admit a new epoch where the evidence already justifies it: not sent, rejected before
    execution, or reconciled as not committed."""
    note = _require_note(note)
    with transaction.atomic():
        command = _lock(command_id)
        _refuse_unless(command, OperatorDecision.Action.RETRY, seen)
        if finding_refusal(
            OperatorDecision.Action.RETRY, state=command.state, finding=last_finding(command)
        ):
            raise Refused(
                ErrorCode.NOT_JUSTIFIED,
                "The effect was reconciled as committed: a retry would duplicate it.",
                409,
            )
        decision = _record(
            command,
            action=OperatorDecision.Action.RETRY,
            operator=operator,
            note=note,
            state_after=command.state,
        )
        epoch = _admit(command, decision, operator, note)
    return Done(
        decision,
        f"Retry admitted as epoch {epoch.number}, justified by "
        f"“{epoch.get_justification_display()}”.",
        epoch,
    )


def command_compensate(
    *,
    command_id: Any,
    operator: str,
    note: str,
    manual_evidence: str = "",
    seen: str | None = None,
) -> Done:
    """Undo a committed effect: the adapter's compensation (the payments reversal), or a
    compensation done elsewhere and recorded with its evidence. One at a time: while the
    adapter is asked, every other compensation is refused (``_refuse_while_compensating``)."""
    note = _require_note(note)
    with transaction.atomic():
        command = _lock(command_id)
        _refuse_unless(command, OperatorDecision.Action.COMPENSATE, seen)
        if finding_refusal(
            OperatorDecision.Action.COMPENSATE, state=command.state, finding=last_finding(command)
        ):
            raise Refused(
                ErrorCode.NOT_COMMITTED,
                "The effect was reconciled as not committed: there is nothing to compensate.",
                409,
            )
        _refuse_while_compensating(command)
        if manual_evidence.strip():
            decision = _record(
                command,
                action=OperatorDecision.Action.COMPENSATE,
                operator=operator,
                note=note,
                finding=OperatorDecision.Finding.COMPENSATED,
                evidence=manual_evidence.strip(),
                state_after=Command.State.COMPENSATED,
                data={"method": "manual"},
            )
            return Done(decision, "Compensation recorded.")
        adapter = adapters.adapter_for(command.occurrence.tool.adapter, tenant_id=command.tenant_id)
        if adapter is None or not adapter.can_compensate:
            raise ServiceError(
                ErrorCode.CANNOT_COMPENSATE,
                "This tool's adapter cannot compensate: do it elsewhere and record it with "
                "its evidence.",
                409,
            )
        # The effect's receipt: an execution's or an effect query's, never a reversal's.
        receipt = (
            AdapterInvocation.objects.filter(command=command, kind__in=_EFFECT_KINDS)
            .exclude(receipt="")
            .order_by("-number")
            .values_list("receipt", flat=True)
            .first()
        ) or ""
        if not receipt:
            raise ServiceError(
                ErrorCode.NO_RECEIPT,
                "No receipt of the effect is recorded, so the adapter cannot name what to "
                "reverse: record a manual compensation.",
                409,
            )
        # Committed before the call: the compensation in progress, for every other one.
        invocation = invocation_open(
            command, kind=AdapterInvocation.Kind.COMPENSATE, justification="operator_compensation"
        )
        state_asked = command.state
        call = call_of(command)
    result = adapter.compensate(call, receipt)

    def decide(command: Command) -> Done:
        if command.state != state_asked:
            raise Refused(
                ErrorCode.STATE_CHANGED,
                f"The effect changed to {command.get_state_display().lower()} meanwhile; the "
                "adapter's answer is kept on the invocation.",
                409,
            )
        if not isinstance(result, Committed):
            raise ServiceError(
                ErrorCode.COMPENSATION_FAILED,
                f"The adapter did not confirm the reversal: {_detail(result)}. Its answer is "
                "kept on the invocation; the effect is still "
                f"{command.get_state_display().lower()}.",
                409,
            )
        decision = _record(
            command,
            action=OperatorDecision.Action.COMPENSATE,
            operator=operator,
            note=note,
            finding=OperatorDecision.Finding.COMPENSATED,
            evidence=result.receipt,
            state_after=Command.State.COMPENSATED,
            data={"method": "adapter", "reversal": result.receipt, "of": receipt},
        )
        return Done(
            decision, f"Compensated by the adapter: reversal {result.receipt} of {receipt}."
        )

    return _after_call(command_id, invocation, result, decide)
