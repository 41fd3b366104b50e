"""A command as the API shows it: its effect, invocations, epochs with their admissions,
and interruptions."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Prefetch

from approvals.models import (
    Command,
    Epoch,
    Tenant,
)
from reconciliation.models import (
    AdapterInvocation,
    EpochAdmission,
    Interruption,
)


def command_get_for_tenant(*, tenant: Tenant, command_id: uuid.UUID) -> Command | None:
    """A command with its invocations, interruptions and its occurrence's epochs (with
    what admitted each), in a fixed number of queries."""
    return (
        Command.objects.filter(tenant=tenant, pk=command_id)
        .select_related("occurrence__tool")
        .prefetch_related(
            Prefetch("invocations", queryset=AdapterInvocation.objects.order_by("number")),
            Prefetch("interruptions", queryset=Interruption.objects.order_by("created_at")),
            Prefetch(
                "occurrence__epochs",
                queryset=Epoch.objects.order_by("number").select_related("admission"),
            ),
        )
        .first()
    )


def epoch_admission(epoch: Epoch) -> EpochAdmission | None:
    try:
        return epoch.admission  # type: ignore[attr-defined,no-any-return]
    except EpochAdmission.DoesNotExist:
        return None


def command_detail(command: Command) -> dict[str, Any]:
    """The command as ``GET /api/v1/commands/{id}`` answers it."""
    invocations = list(command.invocations.all())  # type: ignore[attr-defined]
    epochs = list(command.occurrence.epochs.all())
    return {
        "command_id": str(command.pk),
        "occurrence_id": str(command.occurrence_id),
        "tool": command.occurrence.tool.name,
        "idempotency_key": command.idempotency_key,
        "execution_id": command.execution_id,
        "executed_by": command.executed_by,
        "state": command.state,
        "effect_state": command.effect_state,
        "created_at": command.created_at,
        "updated_at": command.updated_at,
        "invocation_count": len(invocations),
        "invocations": [
            {
                "number": i.number,
                "kind": i.kind,
                "epoch": next((e.number for e in epochs if e.pk == i.epoch_id), None),
                "justification": i.justification,
                "started_at": i.started_at,
                "finished_at": i.finished_at,
                "outcome": i.outcome or None,
                "receipt": i.receipt or None,
                "detail": i.detail or None,
            }
            for i in invocations
        ],
        "epochs": [
            {
                "number": e.number,
                "execution_id": e.execution_id,
                "justification": e.justification,
                "created_at": e.created_at,
                "admission": _admission_out(epoch_admission(e)),
            }
            for e in epochs
        ],
        "interruptions": [
            {
                "id": x.pk,
                "kind": x.kind,
                "epoch": next((e.number for e in epochs if e.pk == x.epoch_id), None),
                "challenges": x.challenges,
                "detail": x.detail or None,
                "created_at": x.created_at,
                "resolved_at": x.resolved_at,
            }
            for x in command.interruptions.all()  # type: ignore[attr-defined]
        ],
    }


def _admission_out(admission: EpochAdmission | None) -> dict[str, Any] | None:
    if admission is None:
        return None
    return {
        "justification": admission.justification,
        "basis": admission.basis,
        "decided_by": admission.decided_by,
        "reason": admission.reason or None,
        "interruption": admission.interruption_id,
        "created_at": admission.created_at,
    }
