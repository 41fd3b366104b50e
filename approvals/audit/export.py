"""The audit trail read out: the NDJSON export with its cursor (never skipping a late
commit), and the duplicate deliveries of ingested events."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import (
    Max,
    QuerySet,
)

from approvals.models import (
    AuditDuplicateDelivery,
    AuditEvent,
    Tenant,
    stored_time_text,
)


def audit_events_after(*, tenant: Tenant, after: int = 0) -> Iterator[AuditEvent]:
    return (
        AuditEvent.objects.filter(tenant=tenant, id__gt=after)
        .order_by("id")
        .iterator(chunk_size=500)
    )


# Advisory lock keys from 2^62 up are the open audit writers' (migration 0008): each is
# 2^62 + the largest audit event id drawn when the transaction wrote its first event.
AUDIT_WRITER_KEY_BASE = 2**62


def audit_watermark() -> int:
    """The audit event id up to which the trail is settled: every event with this id or a
    lower one has committed (and is visible to a query started after this call) or never
    will. Serving only ids up to it is what lets a cursor never skip an event.

    Ids come from a sequence, so two transactions can commit them out of order: id 100 can
    commit after id 101 is already visible, and a reader that had moved its cursor past 101
    would never see 100. On PostgreSQL each transaction that writes audit events holds a
    shared advisory lock keyed by the largest id drawn before its first event (migration
    0008); this reads the sequence's last value and then the smallest key of the other
    open writers (the caller's own transaction excluded: its events are visible to it).
    SQLite admits one writer at a time, so its ids commit in order."""
    if connection.vendor != "postgresql":
        last: int | None = AuditEvent.objects.aggregate(last=Max("id"))["last"]
        return last or 0
    table = AuditEvent._meta.db_table
    with connection.cursor() as cursor:
        # The order of these two reads matters: a writer whose lock the second misses drew
        # its ids after the first.
        cursor.execute(
            "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence(%s, 'id')::regclass),"
            " 0)",
            [table],
        )
        drawn: int = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT min(((l.classid::bigint << 32) | l.objid::bigint) - %s)
              FROM pg_locks l
             WHERE l.locktype = 'advisory' AND l.objsubid = 1
               AND l.classid::bigint >= %s
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.pid IS DISTINCT FROM pg_backend_pid()
            """,
            [AUDIT_WRITER_KEY_BASE, AUDIT_WRITER_KEY_BASE >> 32],
        )
        oldest_open: int | None = cursor.fetchone()[0]
    return drawn if oldest_open is None else min(drawn, oldest_open)


def audit_cursor_latest(*, tenant: Tenant) -> int:
    """The newest cursor a client can start from without missing anything written later:
    the tenant's newest settled event id (0 when there is none)."""
    settled = audit_watermark()
    last: int | None = AuditEvent.objects.filter(tenant=tenant, id__lte=settled).aggregate(
        last=Max("id")
    )["last"]
    return last or 0


@dataclass(frozen=True)
class AuditFilter:
    """The export's filters; ``kind`` is exact, or a prefix when it ends in ``*``."""

    kind: str | None = None
    occurrence_id: uuid.UUID | None = None
    fingerprint: str | None = None
    execution_id: str | None = None
    since: datetime | None = None

    @property
    def kind_prefix(self) -> str | None:
        return self.kind[:-1] if self.kind is not None and self.kind.endswith("*") else None


def audit_event_line(event: AuditEvent) -> str:
    """One line of the export, as ``GET /api/v1/audit/events`` has always written it (plus
    the chain and ingestion keys). ``_AUDIT_LINE_SQL`` writes the same on PostgreSQL."""
    return (
        json.dumps(
            {
                "cursor": event.id,
                "event_id": str(event.event_id),
                "kind": event.kind,
                "occurrence_id": str(event.occurrence_id) if event.occurrence_id else None,
                "actor": event.actor,
                "token_fingerprint": event.token_fingerprint or None,
                "decision": event.decision or None,
                "reason_code": event.reason_code or None,
                "execution_id": event.execution_id or None,
                "message_id": event.message_id or None,
                "command_id": str(event.command_id) if event.command_id else None,
                "trace_id": event.trace_id or None,
                "source_time": stored_time_text(event.source_time) or event.source_time.isoformat(),
                "ingested_at": event.ingested_at.isoformat(),
                "data": event.data,
                "ingestion_id": event.ingestion_id,
                "chain_seq": event.chain_seq,
                "hash": event.hash,
                "prev_hash": event.prev_hash,
            },
            sort_keys=True,
        )
        + "\n"
    )


def _sql_time(column: str) -> str:
    # datetime.isoformat() of a UTC datetime: no fraction when the microseconds are 0. A
    # time outside the years 1-9999 (in UTC) is written as stored_time_text writes it.
    return (
        f"CASE WHEN {column} < '0001-01-01 00:00:00+00' OR {column} >= '10000-01-01 00:00:00+00'"
        f" THEN {column}::text ELSE"
        f" replace(to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'),"
        f" '.000000', '') || '+00:00' END"
    )


def _sql_text_or_null(column: str) -> str:
    return f"coalesce(to_json(nullif({column}, ''))::text, 'null')"


# The line of ``audit_event_line``, written by PostgreSQL: the same keys in the same order
# with the same separators, the same values. Two spellings differ and read back equal as
# JSON: non-ASCII characters are written as UTF-8 rather than \u escapes, and the keys
# inside "data" come in jsonb's order rather than sorted.
_AUDIT_LINE_SQL = f"""concat(
    '{{"actor": ', to_json(e.actor::text),
    ', "chain_seq": ', coalesce(e.chain_seq::text, 'null'),
    ', "command_id": ', coalesce('"' || e.command_id::text || '"', 'null'),
    ', "cursor": ', e.id,
    ', "data": ', e.data,
    ', "decision": ', {_sql_text_or_null("e.decision")},
    ', "event_id": "', e.event_id, '"',
    ', "execution_id": ', {_sql_text_or_null("e.execution_id")},
    ', "hash": ', coalesce(to_json(e.hash::text)::text, 'null'),
    ', "ingested_at": "', {_sql_time("e.ingested_at")}, '"',
    ', "ingestion_id": ', coalesce(e.ingestion_id::text, 'null'),
    ', "kind": ', to_json(e.kind::text),
    ', "message_id": ', {_sql_text_or_null("e.message_id")},
    ', "occurrence_id": ', coalesce('"' || e.occurrence_id::text || '"', 'null'),
    ', "prev_hash": ', coalesce(to_json(e.prev_hash::text)::text, 'null'),
    ', "reason_code": ', {_sql_text_or_null("e.reason_code")},
    ', "source_time": "', {_sql_time("e.source_time")}, '"',
    ', "token_fingerprint": ', {_sql_text_or_null("e.token_fingerprint")},
    ', "trace_id": ', {_sql_text_or_null("e.trace_id")},
    E'}}\\n')"""


# Lines per query of the PostgreSQL export: a few MB of text at a time.
AUDIT_EXPORT_PAGE = 5000


def audit_export(
    *,
    tenant: Tenant,
    after: int,
    through: int,
    filters: AuditFilter | None = None,
    limit: int | None = None,
) -> Iterator[str]:
    """The tenant's events with ``after < id <= through`` that match ``filters``, in id
    order, as NDJSON text in chunks; at most ``limit`` events.

    On PostgreSQL the database writes the lines itself, a page of ``AUDIT_EXPORT_PAGE``
    at a time (keyset by id), so the export runs near the speed of ``COPY`` in constant
    memory; elsewhere Django reads the rows and ``audit_event_line`` writes them."""
    filters = filters or AuditFilter()
    if connection.vendor == "postgresql":
        return _audit_export_sql(tenant.pk, after, through, filters, limit)
    return _audit_export_orm(tenant, after, through, filters, limit)


def _audit_export_sql(
    tenant_id: int, after: int, through: int, filters: AuditFilter, limit: int | None
) -> Iterator[str]:
    conditions = ["e.tenant_id = %s", "e.id > %s", "e.id <= %s"]
    values: list[Any] = []
    if filters.kind_prefix is not None:
        escaped = filters.kind_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        conditions.append("e.kind LIKE %s")
        values.append(escaped + "%")
    elif filters.kind is not None:
        conditions.append("e.kind = %s")
        values.append(filters.kind)
    if filters.occurrence_id is not None:
        conditions.append("e.occurrence_id = %s")
        values.append(filters.occurrence_id)
    if filters.fingerprint is not None:
        conditions.append("e.token_fingerprint = %s")
        values.append(filters.fingerprint)
    if filters.execution_id is not None:
        conditions.append("e.execution_id = %s")
        values.append(filters.execution_id)
    if filters.since is not None:
        conditions.append("e.source_time >= %s")
        values.append(filters.since)
    # Only constant fragments are joined here; every value is a query parameter.
    sql = f"""
        SELECT count(*), max(page.id), string_agg(page.line, '' ORDER BY page.id)
          FROM (SELECT e.id, {_AUDIT_LINE_SQL} AS line
                  FROM {AuditEvent._meta.db_table} e
                 WHERE {" AND ".join(conditions)}
                 ORDER BY e.id
                 LIMIT %s) page
    """  # noqa: S608
    remaining = limit
    while remaining is None or remaining > 0:
        size = AUDIT_EXPORT_PAGE if remaining is None else min(AUDIT_EXPORT_PAGE, remaining)
        with connection.cursor() as cursor:
            cursor.execute(sql, [tenant_id, after, through, *values, size])
            count, last, text = cursor.fetchone()
        if not count:
            return
        yield text
        if count < size:
            return
        after = last
        if remaining is not None:
            remaining -= count


def _audit_export_orm(
    tenant: Tenant, after: int, through: int, filters: AuditFilter, limit: int | None
) -> Iterator[str]:
    events = AuditEvent.objects.filter(tenant=tenant, id__gt=after, id__lte=through)
    if filters.kind_prefix is not None:
        events = events.filter(kind__startswith=filters.kind_prefix)
    elif filters.kind is not None:
        events = events.filter(kind=filters.kind)
    if filters.occurrence_id is not None:
        events = events.filter(occurrence_id=filters.occurrence_id)
    if filters.fingerprint is not None:
        events = events.filter(token_fingerprint=filters.fingerprint)
    if filters.execution_id is not None:
        events = events.filter(execution_id=filters.execution_id)
    if filters.since is not None:
        events = events.filter(source_time__gte=filters.since)
    events = events.order_by("id")
    if limit is not None:
        events = events[:limit]
    chunk: list[str] = []
    for event in events.iterator(chunk_size=500):
        chunk.append(audit_event_line(event))
        if len(chunk) == 500:
            yield "".join(chunk)
            chunk = []
    if chunk:
        yield "".join(chunk)


def audit_duplicate_deliveries(
    tenant: Tenant, event_id: uuid.UUID | str | None = None
) -> QuerySet[AuditDuplicateDelivery]:
    """Producer events ingested more than once: each row is a batch that delivered again
    an event the console had already stored, oldest first.

    ``row.event_id`` is the producer's event id; ``row.ingestion`` (its id and
    ``received_at``) the batch that brought it again, ``row.line`` its first line there and
    ``row.copies`` how many lines carried it; ``row.same_payload`` whether they say what the
    stored event says, and ``row.payload`` the line as sent when they do not (null when
    they do, or past ``approvals.audit.ingest.DUPLICATE_PAYLOADS_KEPT``). ``row.original`` is
    the event as stored: its ``ingestion_id`` and
    ``ingested_at`` are those of the first delivery. A producer event id with rows here is
    a duplicated audit delivery; the event itself happened once."""
    deliveries = AuditDuplicateDelivery.objects.filter(tenant=tenant).select_related(
        "ingestion", "original"
    )
    if event_id is not None:
        deliveries = deliveries.filter(event_id=event_id)
    return deliveries.order_by("id")
