"""Effects a runtime reports for the commands it executes itself: only the execution that
holds the command's current epoch may report, and only from a state that admits it."""

from __future__ import annotations

import uuid

from django.db import transaction

from approvals.audit.record import audit_record, db_now
from approvals.errors import ErrorCode, ServiceError
from approvals.models import Command, Tenant
from approvals.vocabulary import AuditKind, EventDecision, EventReason, ReportedOutcome
from reconciliation.dispatch import current_epoch
from reconciliation.models import (
    Interruption,
)

_STATE_FOR_REPORT: dict[str, str] = {
    ReportedOutcome.COMMITTED: Command.State.COMMITTED,
    ReportedOutcome.REJECTED: Command.State.REJECTED,
    ReportedOutcome.OUTCOME_UNKNOWN: Command.State.OUTCOME_UNKNOWN,
    # An authentication challenge refused the call before execution.
    ReportedOutcome.INTERRUPTED: Command.State.REJECTED,
}


# What a runtime's report may move the effect from: the outbox, a call it said it started,
# and an unknown outcome it has since learned more about.
_REPORTABLE_FROM = (Command.State.PENDING, Command.State.SENDING, Command.State.OUTCOME_UNKNOWN)


def _lock_command(command_id: uuid.UUID, tenant: Tenant) -> Command:
    command = (
        Command.objects.select_for_update(of=("self",))
        .select_related("occurrence__tool")
        .filter(pk=command_id, tenant=tenant)
        .first()
    )
    if command is None:
        raise ServiceError(
            ErrorCode.NOT_FOUND, "No such command for this runtime key's tenant.", 404
        )
    return command


def command_report_effect(
    *,
    tenant: Tenant,
    command_id: uuid.UUID,
    execution_id: str,
    outcome: str,
    actor: str,
    receipt: str = "",
    detail: str = "",
    challenges: list[str] | None = None,
) -> Command:
    """Record the effect a runtime reports for a command it executes itself.

    Only the execution of the command's current epoch may report; any other gets
    ``not_your_command`` (403) and a security audit event. The same report twice is
    accepted once; a report that contradicts a settled effect is refused."""
    with transaction.atomic():
        command = _lock_command(command_id, tenant)
        epoch = current_epoch(command)
        refused = execution_id != epoch.execution_id
        if refused:
            # Recorded and committed: a report from the wrong execution is a security
            # event (a stolen command id, or a confused runtime).
            audit_record(
                kind=AuditKind.EFFECT_REPORT_REFUSED,
                tenant=tenant,
                occurrence=command.occurrence_id,
                actor=actor,
                decision=EventDecision.REFUSED,
                reason_code=EventReason.OTHER_EXECUTION,
                execution_id=execution_id,
                command_id=command.pk,
                data={"epoch": epoch.number, "outcome": outcome},
            )
    if refused:
        raise ServiceError(
            ErrorCode.NOT_YOUR_COMMAND,
            "Only the execution that holds this command's current epoch may report on it.",
            403,
        )
    with transaction.atomic():
        command = _lock_command(command_id, tenant)
        if current_epoch(command).pk != epoch.pk:
            raise ServiceError(ErrorCode.EPOCH_CHANGED, "A new epoch was admitted meanwhile.", 409)
        if command.executed_by != Command.ExecutedBy.RUNTIME:
            raise ServiceError(
                ErrorCode.EXECUTED_BY_CONSOLE,
                "The console executes this command through its adapter; its effect is "
                "recorded by the console.",
                409,
            )
        target = _STATE_FOR_REPORT[outcome]
        if command.state == target and outcome != ReportedOutcome.INTERRUPTED:
            return command  # the same report again: already recorded
        if command.state not in _REPORTABLE_FROM:
            raise ServiceError(
                ErrorCode.EFFECT_ALREADY_RECORDED,
                f"This command's effect is already {command.state}; it cannot become {target}.",
                409,
            )
        moved = Command.objects.filter(pk=command.pk, state=command.state).update(
            state=target, updated_at=db_now()
        )
        assert moved == 1, "the row lock guarantees the state read under it"
        audit_record(
            kind=AuditKind.for_effect(target),
            tenant=tenant,
            occurrence=command.occurrence_id,
            actor=actor,
            decision=target,
            reason_code=EventReason.reported(outcome),
            execution_id=execution_id,
            command_id=command.pk,
            data={"receipt": receipt, "detail": detail, "epoch": epoch.number},
        )
        if outcome == ReportedOutcome.INTERRUPTED:
            interruption = Interruption.objects.create(
                command=command,
                epoch=epoch,
                kind=Interruption.Kind.AUTH_CHALLENGE,
                challenges=list(challenges or []),
                detail=detail,
            )
            audit_record(
                kind=AuditKind.RECOVERY_INTERRUPTED,
                tenant=tenant,
                occurrence=command.occurrence_id,
                actor=actor,
                decision=EventDecision.INTERRUPTED,
                reason_code=Interruption.Kind.AUTH_CHALLENGE,
                execution_id=execution_id,
                command_id=command.pk,
                data={
                    "interruption": interruption.pk,
                    "challenges": list(challenges or []),
                    "epoch": epoch.number,
                },
            )
        command.state = target
    return command
