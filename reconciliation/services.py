"""Writes of effect, recovery and authority evidence after the claim.

The rule this module keeps (DESIGN.md, "the three evidence dimensions"): restored
authority (a replaced credential, a runtime asking again) never admits a second attempt
by itself. A new epoch is admitted only with a recorded justification: the earlier effect
is known ``not_sent`` or ``rejected``, or the contract is ``read_only`` or
``idempotent_with_key``. Otherwise the occurrence waits for reconciliation.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from approvals.audit.record import audit_record, db_now
from approvals.errors import ServiceError
from approvals.models import Command, Epoch, Occurrence, Tenant, ToolContract
from approvals.vocabulary import AuditKind, EventDecision, EventReason
from reconciliation import credentials
from reconciliation.dispatch import current_epoch
from reconciliation.models import (
    AdapterCredential,
    EpochAdmission,
    Interruption,
    OperatorDecision,
)

State = Command.State
Justification = Epoch.Justification


# --- effects the runtime reports ---------------------------------------------------------


class ReportedOutcome:
    COMMITTED = "committed"
    REJECTED = "rejected"
    OUTCOME_UNKNOWN = "outcome_unknown"
    INTERRUPTED = "interrupted"
    ALL = (COMMITTED, REJECTED, OUTCOME_UNKNOWN, INTERRUPTED)


_STATE_FOR_REPORT = {
    ReportedOutcome.COMMITTED: State.COMMITTED,
    ReportedOutcome.REJECTED: State.REJECTED,
    ReportedOutcome.OUTCOME_UNKNOWN: State.OUTCOME_UNKNOWN,
    # An authentication challenge refused the call before execution.
    ReportedOutcome.INTERRUPTED: State.REJECTED,
}

# What a runtime's report may move the effect from: the outbox, a call it said it started,
# and an unknown outcome it has since learned more about.
_REPORTABLE_FROM = (State.PENDING, State.SENDING, State.OUTCOME_UNKNOWN)


def _lock_command(command_id: uuid.UUID, tenant: Tenant) -> Command:
    command = (
        Command.objects.select_for_update(of=("self",))
        .select_related("occurrence__tool")
        .filter(pk=command_id, tenant=tenant)
        .first()
    )
    if command is None:
        raise ServiceError("not_found", "No such command for this runtime key's tenant.", 404)
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
            "not_your_command",
            "Only the execution that holds this command's current epoch may report on it.",
            403,
        )
    with transaction.atomic():
        command = _lock_command(command_id, tenant)
        if current_epoch(command).pk != epoch.pk:
            raise ServiceError("epoch_changed", "A new epoch was admitted meanwhile.", 409)
        if command.executed_by != Command.ExecutedBy.RUNTIME:
            raise ServiceError(
                "executed_by_console",
                "The console executes this command through its adapter; its effect is "
                "recorded by the console.",
                409,
            )
        target = _STATE_FOR_REPORT[outcome]
        if command.state == target and outcome != ReportedOutcome.INTERRUPTED:
            return command  # the same report again: already recorded
        if command.state not in _REPORTABLE_FROM:
            raise ServiceError(
                "effect_already_recorded",
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


# --- new epochs ----------------------------------------------------------------------------


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
    if command.state == State.RECONCILED:
        if last_finding(command) == OperatorDecision.Finding.NOT_COMMITTED:
            return Admission(
                Justification.RECONCILED_NOT_COMMITTED,
                "the effect was reconciled as not committed",
            )
        return None
    if command.state == State.PENDING:
        return Admission(Justification.NOT_SENT, "the earlier effect is known not sent")
    if command.state == State.REJECTED:
        return Admission(Justification.REJECTED, "the earlier call was refused before execution")
    if contract.replay_safety == ToolContract.ReplaySafety.READ_ONLY:
        return Admission(Justification.READ_ONLY, "the tool contract is read-only")
    if contract.replay_safety == ToolContract.ReplaySafety.IDEMPOTENT_WITH_KEY:
        return Admission(
            Justification.IDEMPOTENT_WITH_KEY,
            "the tool contract is idempotent with the command's key",
        )
    return None


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
    constraint), then the command. Raises ``needs_reconciliation`` (409) naming the
    effect when nothing justifies another attempt, and ``effect_committed`` when the
    effect already happened."""
    with transaction.atomic():
        Occurrence.objects.select_for_update(of=("self",)).filter(pk=command.occurrence_id).first()
        command = (
            Command.objects.select_for_update(of=("self",))
            .select_related("occurrence__tool")
            .get(pk=command.pk)
        )
        contract = command.occurrence.tool
        admission = admission_for(command, contract, decision)
        settled = command.state in (State.COMMITTED, State.COMPENSATED) or (
            command.state == State.RECONCILED and admission is None
        )
        if settled:
            raise ServiceError(
                "effect_committed",
                f"The effect is already {command.state}: there is nothing to attempt again.",
                409,
            )
        if command.state == State.SENDING and admission is None:
            raise ServiceError(
                "needs_reconciliation",
                "A call of this command may be in flight (effect sending); wait for its "
                "outcome before asking for another attempt.",
                409,
            )
        if admission is None:
            raise ServiceError(
                "needs_reconciliation",
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
                "execution_id_used",
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
        if command.state != State.PENDING:
            Command.objects.filter(pk=command.pk, state=command.state).update(
                state=State.PENDING, updated_at=now
            )
        Interruption.objects.filter(command=command, resolved_at__isnull=True).update(
            resolved_at=now
        )
        audit_record(
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
            "no_command",
            "This occurrence has no command yet: claim its approval first.",
            409,
        )
    return epoch_admit(command=command, execution_id=execution_id, decided_by=actor, reason=reason)


# --- credentials: authority ------------------------------------------------------------------


def credential_replace(*, tenant: Tenant, adapter: str, secret: str, actor: str) -> list[Any]:
    """Store a new adapter secret for a tenant (authority restored), then admit a new epoch
    for each command that an authentication challenge stopped, where the evidence allows
    it. Returns what each interrupted command got: an epoch, or the refusal."""
    if not secret:
        raise ServiceError("secret_required", "Enter the new secret.", 422)
    with transaction.atomic():
        AdapterCredential.objects.update_or_create(
            tenant=tenant,
            adapter=adapter,
            defaults={"secret_encrypted": credentials.encrypt(secret), "updated_by": actor},
        )
        audit_record(
            kind=AuditKind.CREDENTIALS_REFRESHED,
            tenant=tenant,
            actor=actor,
            decision=EventDecision.AUTHORITY_RESTORED,
            data={"adapter": adapter},
        )
    outcomes: list[Any] = []
    waiting = (
        Interruption.objects.filter(
            resolved_at__isnull=True,
            kind=Interruption.Kind.AUTH_CHALLENGE,
            command__tenant=tenant,
            command__occurrence__tool__adapter=adapter,
        )
        .select_related("command")
        .order_by("pk")
    )
    for interruption in waiting:
        try:
            outcomes.append(
                epoch_admit(
                    command=interruption.command,
                    execution_id=f"console-epoch-{uuid.uuid4().hex[:12]}",
                    decided_by="policy",
                    reason=f"{adapter} credentials refreshed by {actor}",
                    interruption=interruption,
                )
            )
        except ServiceError as refusal:
            audit_record(
                kind=AuditKind.EPOCH_WAITING,
                tenant=tenant,
                occurrence=interruption.command.occurrence_id,
                actor="policy",
                decision=EventDecision.WAITING,
                reason_code=refusal.code,
                command_id=interruption.command_id,
                data={"why": refusal.message},
            )
            outcomes.append(refusal)
    return outcomes
