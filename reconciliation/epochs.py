"""New epochs: another attempt at an occurrence, admitted only with a recorded justification
(the contract's replay safety, a known effect, a reconciliation, an operator's acceptance of
the ambiguity), never merged with or overwriting an earlier one."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from approvals.audit.record import audit_record, db_now
from approvals.callbacks.outbox import callback_delivery_create
from approvals.errors import ErrorCode, ServiceError
from approvals.models import Command, Epoch, Occurrence, Tenant, ToolContract
from approvals.vocabulary import AuditKind, EventDecision
from reconciliation.dispatch import current_epoch
from reconciliation.models import (
    EpochAdmission,
    Interruption,
    OperatorDecision,
)

Justification = Epoch.Justification


@dataclass(frozen=True)
class Admission:
    justification: str
    basis: str


def last_finding(command: Command) -> str:
    """What the newest reconciling decision established: committed, not_committed or ""."""
    finding: str | None = (
        OperatorDecision.objects.filter(
            command=command,
            action__in=(OperatorDecision.Action.QUERY_EFFECT, OperatorDecision.Action.RECONCILE),
        )
        .exclude(finding="")
        .order_by("-created_at", "-pk")
        .values_list("finding", flat=True)
        .first()
    )
    return finding or ""


def admission_for(
    command: Command, contract: ToolContract, decision: OperatorDecision | None = None
) -> Admission | None:
    """The justification the evidence gives for another attempt, or None."""
    if decision is not None and decision.action == OperatorDecision.Action.ACCEPT_AMBIGUITY:
        return Admission(
            Justification.AMBIGUITY_ACCEPTED,
            f"{decision.operator} accepted that a duplicate is possible (decision {decision.pk})",
        )
    if command.state == Command.State.RECONCILED:
        if last_finding(command) == OperatorDecision.Finding.NOT_COMMITTED:
            return Admission(
                Justification.RECONCILED_NOT_COMMITTED,
                "the effect was reconciled as not committed",
            )
        return None
    if command.state == Command.State.PENDING:
        return Admission(Justification.NOT_SENT, "the earlier effect is known not sent")
    if command.state == Command.State.REJECTED:
        return Admission(Justification.REJECTED, "the earlier call was refused before execution")
    if contract.replay_safety == ToolContract.ReplaySafety.READ_ONLY:
        return Admission(Justification.READ_ONLY, "the tool contract is read-only")
    if contract.replay_safety == ToolContract.ReplaySafety.IDEMPOTENT_WITH_KEY:
        return Admission(
            Justification.IDEMPOTENT_WITH_KEY,
            "the tool contract is idempotent with the command's key",
        )
    return None


def command_lock(command_id: Any) -> Command | None:
    """Lock a command for a decision about it: its occurrence first, then the command, the
    one order every path that takes both follows (operators' decisions, epoch admissions),
    so none waits for another in a cycle.

    The occurrence is locked ``FOR NO KEY UPDATE``: that serializes these paths as well as
    ``FOR UPDATE`` would, and still lets a delivery that holds the command (dispatch, a
    runtime's report) insert rows referencing the occurrence (its audit events, whose
    foreign key check takes ``FOR KEY SHARE``). With ``FOR UPDATE`` such a delivery, holding
    the command, waited for an operator who held the occurrence and waited for the
    command: a deadlock, and a 503 for the operator."""
    occurrence_id = Command.objects.filter(pk=command_id).values("occurrence_id")
    Occurrence.objects.select_for_update(no_key=True, of=("self",)).filter(
        pk__in=occurrence_id
    ).first()
    return (
        Command.objects.select_for_update(of=("self",))
        .select_related("occurrence__tool", "approval__proposal")
        .filter(pk=command_id)
        .first()
    )


def epoch_admit(
    *,
    command: Command,
    execution_id: str,
    decided_by: str,
    reason: str = "",
    interruption: Interruption | None = None,
    decision: OperatorDecision | None = None,
) -> Epoch:
    """Admit the occurrence's next epoch for ``command`` if the evidence justifies it.

    Locks the occurrence first (epoch numbers are count + 1, guarded by a unique
    constraint), then the command (``command_lock``). Raises ``needs_reconciliation``
    (409) naming the effect when nothing justifies another attempt, and
    ``effect_committed`` when the effect already happened."""
    with transaction.atomic():
        locked = command_lock(command.pk)
        assert locked is not None, "commands are never deleted"
        command = locked
        contract = command.occurrence.tool
        admission = admission_for(command, contract, decision)
        settled = command.state in (Command.State.COMMITTED, Command.State.COMPENSATED) or (
            command.state == Command.State.RECONCILED and admission is None
        )
        if settled:
            raise ServiceError(
                ErrorCode.EFFECT_COMMITTED,
                f"The effect is already {command.state}: there is nothing to attempt again.",
                409,
            )
        if command.state == Command.State.SENDING and admission is None:
            raise ServiceError(
                ErrorCode.NEEDS_RECONCILIATION,
                "A call of this command may be in flight (effect sending); wait for its "
                "outcome before asking for another attempt.",
                409,
            )
        if admission is None:
            raise ServiceError(
                ErrorCode.NEEDS_RECONCILIATION,
                f"The effect of command {command.pk} is {command.state}: another attempt "
                f"could duplicate it, and the contract ({contract.replay_safety}) does not "
                "allow one. An operator must reconcile it first.",
                409,
            )
        previous = current_epoch(command)
        if interruption is None:
            # The stop this epoch recovers from, if one is open.
            interruption = (
                Interruption.objects.filter(command=command, resolved_at__isnull=True)
                .order_by("-created_at")
                .first()
            )
        if Epoch.objects.filter(
            occurrence_id=command.occurrence_id, execution_id=execution_id
        ).exists():
            raise ServiceError(
                ErrorCode.EXECUTION_ID_USED,
                "This execution id already has an epoch of this occurrence; a new attempt "
                "needs a new execution id.",
                409,
            )
        epoch = Epoch.objects.create(
            occurrence_id=command.occurrence_id,
            number=previous.number + 1,
            execution_id=execution_id,
            justification=admission.justification,
            previous=previous,
        )
        EpochAdmission.objects.create(
            epoch=epoch,
            previous=previous,
            command=command,
            interruption=interruption,
            justification=admission.justification,
            basis=admission.basis,
            decided_by=decided_by,
            reason=reason,
            decision=decision,
        )
        now = db_now()
        if command.state != Command.State.PENDING:
            Command.objects.filter(pk=command.pk, state=command.state).update(
                state=Command.State.PENDING, updated_at=now
            )
        Interruption.objects.filter(command=command, resolved_at__isnull=True).update(
            resolved_at=now
        )
        admitted = audit_record(
            kind=AuditKind.EPOCH_ADMITTED,
            tenant=command.tenant_id,
            occurrence=command.occurrence_id,
            actor=decided_by,
            decision=EventDecision.ADMITTED,
            reason_code=admission.justification,
            execution_id=execution_id,
            command_id=command.pk,
            data={
                "epoch": epoch.number,
                "previous_epoch": previous.number,
                "justification": admission.justification,
                "basis": admission.basis,
                "interruption": interruption.pk if interruption else None,
                "operator_decision": decision.pk if decision else None,
                "reason": reason,
            },
        )
        if command.executed_by == Command.ExecutedBy.RUNTIME and decision is not None:
            # An operator admitted it: the runtime that executes the command is told (its
            # callback; its occurrence answer's ``next_attempt`` says so too), as it is
            # told of a reviewer's decision. One it asked for itself, it knows of.
            callback_delivery_create(admitted)
        if command.executed_by == Command.ExecutedBy.CONSOLE:
            from reconciliation.tasks import enqueue

            command_id = str(command.pk)
            transaction.on_commit(lambda: enqueue(command_id))
    return epoch


def occurrence_epoch_request(
    *, tenant: Tenant, occurrence_id: uuid.UUID, execution_id: str, reason: str, actor: str
) -> Epoch:
    """A runtime asks to attempt its occurrence again (``POST …/epochs``)."""
    command = (
        Command.objects.filter(tenant=tenant, occurrence_id=occurrence_id)
        .order_by("-created_at")
        .first()
    )
    if command is None:
        raise ServiceError(
            ErrorCode.NO_COMMAND,
            "This occurrence has no command yet: claim its approval first.",
            409,
        )
    return epoch_admit(command=command, execution_id=execution_id, decided_by=actor, reason=reason)
