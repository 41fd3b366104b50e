"""Other producers' audit events, ingested in batches: each producer event stored once per
tenant, every later delivery of it recorded as a duplicate delivery."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from django.db import connection, transaction
from django.db.models import Count

from approvals.errors import InputError
from approvals.models import (
    AuditDuplicateDelivery,
    AuditEvent,
    AuditIngestion,
    Occurrence,
    RuntimeKey,
)

log = structlog.get_logger("approvals")


_stdlib_log = logging.getLogger("approvals")


# Batches of one tenant are ingested one at a time: an advisory lock (this class, the
# tenant's id) so that two batches carrying one producer event cannot both store it.
_AUDIT_INGEST_LOCK = 0x61756469


@dataclass(frozen=True)
class AuditLine:
    """One producer event of an ingested batch, its shape already checked (``api``)."""

    line: int
    event_id: uuid.UUID
    kind: str
    token_fingerprint: str
    decision: str
    execution_id: str
    message_id: str
    command_id: uuid.UUID | None
    source_time: datetime
    reason_code: str
    occurrence_id: uuid.UUID | None
    payload: dict[str, Any]

    def says(self) -> tuple[Any, ...]:
        return (
            self.kind,
            self.token_fingerprint,
            self.decision,
            self.execution_id,
            self.message_id,
            self.command_id,
            self.source_time,
            self.reason_code,
            self.occurrence_id,
        )


def _event_says(event: AuditEvent) -> tuple[Any, ...]:
    return (
        event.kind,
        event.token_fingerprint,
        event.decision,
        event.execution_id,
        event.message_id,
        event.command_id,
        event.source_time,
        event.reason_code,
        event.occurrence_id,
    )


# Lines as sent that one stored event keeps from its later deliveries when they say something
# else than it: enough to show what a producer reusing an event id sent; beyond that, the
# deliveries are counted. A line is at most about 1 KiB (the fields' lengths, api.audit).
DUPLICATE_PAYLOADS_KEPT = 10


def _duplicate_deliveries(
    tenant_id: int,
    ingestion: AuditIngestion,
    repeated: list[AuditLine],
    stored: dict[uuid.UUID, AuditEvent],
) -> list[AuditDuplicateDelivery]:
    """The rows that record ``repeated``, bounded: one per stored event and per thing said
    in this batch (a thousand copies of a line are one row with ``copies=1000``); a payload
    only for a line that says something else than the stored event, while the event keeps
    fewer than ``DUPLICATE_PAYLOADS_KEPT`` of them; the rest of those lines one row per
    event, counted, without a payload. The first line and the batch stay on every row."""
    if not repeated:
        return []
    originals = {stored[line.event_id].pk for line in repeated}
    kept: dict[int, int] = dict(
        AuditDuplicateDelivery.objects.filter(
            original_id__in=originals, same_payload=False, payload__isnull=False
        )
        .values("original_id")
        .annotate(n=Count("id"))
        .values_list("original_id", "n")
    )
    rows: dict[tuple[Any, ...], AuditDuplicateDelivery] = {}
    for line in repeated:
        original = stored[line.event_id]
        same = line.says() == _event_says(original)
        key: tuple[Any, ...] = (original.pk, same, None if same else line.says())
        if key not in rows and not same and kept.get(original.pk, 0) >= DUPLICATE_PAYLOADS_KEPT:
            key = (original.pk, False, "not kept")
        row = rows.get(key)
        if row is not None:
            row.copies += 1
            continue
        keep = not same and key[2] != "not kept"
        if keep:
            kept[original.pk] = kept.get(original.pk, 0) + 1
        rows[key] = AuditDuplicateDelivery(
            tenant_id=tenant_id,
            ingestion=ingestion,
            original=original,
            event_id=line.event_id,
            line=line.line,
            copies=1,
            payload=line.payload if keep else None,
            same_payload=same,
        )
    return list(rows.values())


def audit_ingest(*, runtime_key: RuntimeKey, lines: list[AuditLine]) -> AuditIngestion:
    """Store a batch of other producers' audit events for the key's tenant, all or nothing.

    A producer event id stored before for the tenant (by an earlier batch, an earlier line
    of this one, or the console itself) is not stored again: the line becomes an
    ``AuditDuplicateDelivery`` of the stored event, with this ingestion's id and time
    (bounded: ``_duplicate_deliveries``). An
    ``occurrence_id`` must name an occurrence of the tenant; otherwise nothing is written
    and the ``InputError`` names every such line."""
    tenant_id = runtime_key.tenant_id
    with transaction.atomic():
        named = {line.occurrence_id for line in lines if line.occurrence_id is not None}
        known = set(
            Occurrence.objects.filter(tenant_id=tenant_id, pk__in=named).values_list(
                "pk", flat=True
            )
        )
        unknown = [line for line in lines if line.occurrence_id not in (None, *known)]
        if unknown:
            details = [
                {
                    "line": line.line,
                    "field": "occurrence_id",
                    "code": "unknown_occurrence",
                    "message": "No such occurrence for this runtime key's tenant.",
                }
                for line in unknown
            ]
            raise InputError(
                "unknown_occurrence",
                f"line {unknown[0].line}: occurrence_id names no occurrence of this tenant.",
                details=details,
            )
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, %s)", [_AUDIT_INGEST_LOCK, tenant_id]
                )
        stored: dict[uuid.UUID, AuditEvent] = {}
        earlier = AuditEvent.objects.filter(
            tenant_id=tenant_id, event_id__in={line.event_id for line in lines}
        ).order_by("id")
        for event in earlier:
            stored.setdefault(event.event_id, event)
        fresh: list[AuditLine] = []
        repeated: list[AuditLine] = []
        seen = set(stored)
        for line in lines:
            if line.event_id in seen:
                repeated.append(line)
            else:
                seen.add(line.event_id)
                fresh.append(line)
        ingestion = AuditIngestion.objects.create(
            tenant_id=tenant_id,
            runtime_key=runtime_key,
            received=len(lines),
            new=len(fresh),
            duplicates=len(repeated),
            trace_id=structlog.contextvars.get_contextvars().get("trace_id", ""),
        )
        events = AuditEvent.objects.bulk_create(
            [
                AuditEvent(
                    event_id=line.event_id,
                    kind=line.kind,
                    tenant_id=tenant_id,
                    occurrence_id=line.occurrence_id,
                    token_fingerprint=line.token_fingerprint,
                    decision=line.decision,
                    reason_code=line.reason_code,
                    execution_id=line.execution_id,
                    message_id=line.message_id,
                    command_id=line.command_id,
                    trace_id=ingestion.trace_id,
                    source_time=line.source_time,
                    ingestion=ingestion,
                )
                for line in fresh
            ],
            batch_size=500,
        )
        stored.update((event.event_id, event) for event in events)
        AuditDuplicateDelivery.objects.bulk_create(
            _duplicate_deliveries(tenant_id, ingestion, repeated, stored), batch_size=500
        )
    if _stdlib_log.isEnabledFor(logging.INFO):
        log.info(
            "audit.ingested",
            ingestion_id=ingestion.pk,
            received=ingestion.received,
            new=ingestion.new,
            duplicates=ingestion.duplicates,
        )
    return ingestion
