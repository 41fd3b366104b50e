"""The callback outbox: every decision on a runtime's request (approved, rejected, expired,
edited, timed out, and an operator's admission of another attempt at a command the
runtime executes: ``attempt_admitted``) becomes a ``CallbackDelivery`` row in the
transaction that decided it, written by the deciding service; its task is published after
commit."""

from __future__ import annotations

import uuid

import structlog
from django.db import transaction
from django.utils import timezone

from approvals.callbacks.tasks import callback_enqueue
from approvals.models import (
    AuditEvent,
    CallbackDelivery,
    Occurrence,
)
from approvals.vocabulary import DECISION_WORDS

log = structlog.get_logger("approvals.callbacks")


def callback_delivery_create(event: AuditEvent) -> CallbackDelivery | None:
    """Called by the service that decided, with the decision's audit event, inside the
    deciding transaction: a delivery row for the proposing key's callback, if it has one
    (None for an event no runtime is told of, or a key without an active callback)."""
    name = DECISION_WORDS.get(event.kind)
    if name is None or event.occurrence_id is None:
        return None
    found = (
        Occurrence.objects.filter(pk=event.occurrence_id)
        .values_list(
            "runtime_key__callback__pk",
            "runtime_key__callback__is_active",
            "run_id",
            "client_ref",
            "status",
        )
        .first()
    )
    if found is None or found[0] is None or not found[1]:
        return None
    callback_id, _, run_id, client_ref, status = found
    delivery_id = uuid.uuid4()
    details = {
        k: v
        for k, v in (event.data or {}).items()
        if k
        in (
            "reason",
            "version",
            "expires_at",
            "to_version",
            "epoch",
            "justification",
            "final_deadline_at",
        )
    }
    if event.execution_id:
        # An admitted attempt's: the execution it runs under (``attempt_admitted``).
        details["execution_id"] = event.execution_id
    body = {
        "delivery_id": str(delivery_id),
        "event": name,
        "occurrence_id": str(event.occurrence_id),
        "run_id": run_id,
        "client_ref": client_ref,
        "status": status,
        "decided_by": event.actor,
        "occurred_at": event.source_time.isoformat() if event.source_time else None,
        "details": details,
    }
    delivery = CallbackDelivery.objects.create(
        id=delivery_id,
        callback_id=callback_id,
        occurrence_id=event.occurrence_id,
        event=name,
        body=body,
        next_attempt_at=timezone.now(),
    )
    transaction.on_commit(lambda: callback_enqueue(delivery_id))
    return delivery
