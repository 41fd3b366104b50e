"""Recording: one audit event appended in the transaction of the change it records, and the
database's clock. A leaf: it records and decides nothing (who else must hear of an event,
the callback outbox say, is the deciding service's call)."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

import structlog
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from approvals.models import (
    AuditEvent,
    Occurrence,
    Tenant,
)

log = structlog.get_logger("approvals")


_stdlib_log = logging.getLogger("approvals")


class DbNow(Now):
    """The database's clock. On PostgreSQL the transaction's start time, so that every
    statement of one claim (the guarded UPDATE and the read that explains a refusal)
    judges expiry against the same instant."""

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="CURRENT_TIMESTAMP", **extra_context)


def db_now() -> datetime:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT CURRENT_TIMESTAMP")
            value: datetime = cursor.fetchone()[0]
            return value
    # SQLite runs in this process: its clock is this process's clock.
    return timezone.now()


def audit_event_new(
    *,
    kind: str,
    tenant: Tenant | int,
    occurrence: Occurrence | uuid.UUID | None = None,
    actor: str = "",
    token_fingerprint: str = "",
    decision: str = "",
    reason_code: str = "",
    execution_id: str = "",
    message_id: str = "",
    command_id: uuid.UUID | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """An audit event as ``audit_record`` appends it, not yet saved: for a statement that
    writes it with the change it records (``approvals.claims.sql``)."""
    return AuditEvent(
        kind=kind,
        tenant_id=tenant if isinstance(tenant, int) else tenant.pk,
        occurrence_id=occurrence.pk if isinstance(occurrence, Occurrence) else occurrence,
        actor=actor,
        token_fingerprint=token_fingerprint,
        decision=decision,
        reason_code=reason_code,
        execution_id=execution_id,
        message_id=message_id,
        command_id=command_id,
        trace_id=structlog.contextvars.get_contextvars().get("trace_id", ""),
        source_time=timezone.now(),
        data=data or {},
    )


def audit_logged(event: AuditEvent) -> None:
    """The log line of an appended event. Every claim writes one of these; when INFO is off,
    not even the event dict is built."""
    if _stdlib_log.isEnabledFor(logging.INFO):
        log.info(
            "audit",
            kind=event.kind,
            decision=event.decision,
            reason_code=event.reason_code,
            fingerprint=event.token_fingerprint,
            execution_id=event.execution_id,
            occurrence_id=str(event.occurrence_id or ""),
        )


def audit_record(
    *,
    kind: str,
    tenant: Tenant | int,
    occurrence: Occurrence | uuid.UUID | None = None,
    actor: str = "",
    token_fingerprint: str = "",
    decision: str = "",
    reason_code: str = "",
    execution_id: str = "",
    message_id: str = "",
    command_id: uuid.UUID | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit event. Call it inside the transaction of the change it records."""
    event = audit_event_new(
        kind=kind,
        tenant=tenant,
        occurrence=occurrence,
        actor=actor,
        token_fingerprint=token_fingerprint,
        decision=decision,
        reason_code=reason_code,
        execution_id=execution_id,
        message_id=message_id,
        command_id=command_id,
        data=data,
    )
    event.save(force_insert=True)
    audit_logged(event)
    return event


def audit_append(events: list[AuditEvent]) -> list[AuditEvent]:
    """Append several events built by ``audit_event_new`` in one ``INSERT`` (one round trip,
    ids in the list's order): what one change records at once, such as a proposal and its
    admission by policy. Call it inside the transaction of that change.

    Unlike ``audit_record`` it sends no ``post_save`` signal (``bulk_create`` does not), so
    it is not for the kinds a receiver counts (``approvals.metrics``: review decisions and
    deadlines)."""
    AuditEvent.objects.bulk_create(events)
    for event in events:
        audit_logged(event)
    return events
