"""A new adapter secret restores authority: it is stored, and each command an authentication
challenge stopped gets a new epoch where the evidence allows it (or the recorded reason it
waits)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from approvals.audit.record import audit_record
from approvals.errors import ErrorCode, ServiceError
from approvals.models import Tenant
from approvals.vocabulary import AuditKind, EventDecision
from reconciliation.credentials import encrypt
from reconciliation.epochs import epoch_admit
from reconciliation.models import (
    AdapterCredential,
    Interruption,
)


def credential_replace(*, tenant: Tenant, adapter: str, secret: str, actor: str) -> list[Any]:
    """Store a new adapter secret for a tenant (authority restored), then admit a new epoch
    for each command that an authentication challenge stopped, where the evidence allows
    it. Returns what each interrupted command got: an epoch, or the refusal."""
    if not secret:
        raise ServiceError(ErrorCode.SECRET_REQUIRED, "Enter the new secret.", 422)
    with transaction.atomic():
        AdapterCredential.objects.update_or_create(
            tenant=tenant,
            adapter=adapter,
            defaults={"secret_encrypted": encrypt(secret), "updated_by": actor},
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
