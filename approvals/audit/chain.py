"""The tenant's hash chain over its audit events: extended off the claim's path (Celery beat,
the export, ``verify_audit_chain``), and verified naming the first edited, deleted or
inserted event."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from django.db import connection, transaction
from django.utils import timezone

from approvals.audit.export import audit_watermark
from approvals.models import (
    AUDIT_CHAIN_GENESIS,
    AuditChainHead,
    AuditEvent,
    Tenant,
)

# Events chained per transaction: the chain head's row lock is held for one batch at most.
AUDIT_CHAIN_BATCH = 1000


def audit_chain_extend(*, tenant_id: int, limit: int | None = None) -> int:
    """Chain the tenant's audit events that are not chained yet, in id order, and return
    the event id through which the tenant's chain is complete (``chained_through``).

    Runs off the claim's hot path: the beat task calls it every few seconds, and so do the
    export (before it answers) and ``verify_audit_chain``. Each batch is one short
    transaction under the row lock of the tenant's ``AuditChainHead``, so concurrent
    callers wait for each other and can never give out one ``chain_seq`` twice. Only ids
    up to ``approvals.audit.export.audit_watermark()`` are chained: every lower id has committed or
    never will, so the chain's order is the ids' order and a late-committing event is
    never passed over. ``limit`` bounds the events one call chains (an export must answer
    quickly; the beat task chains the rest)."""
    chained = 0
    while True:
        size = AUDIT_CHAIN_BATCH if limit is None else min(AUDIT_CHAIN_BATCH, limit - chained)
        done, through, complete = _audit_chain_batch(tenant_id=tenant_id, size=max(size, 0))
        chained += done
        if complete or (limit is not None and chained >= limit):
            return through


def _audit_chain_batch(*, tenant_id: int, size: int) -> tuple[int, int, bool]:
    with transaction.atomic():
        AuditChainHead.objects.bulk_create(
            [AuditChainHead(tenant_id=tenant_id)], ignore_conflicts=True
        )
        head = AuditChainHead.objects.select_for_update().get(tenant_id=tenant_id)
        settled = audit_watermark()
        events = list(
            AuditEvent.objects.filter(
                tenant_id=tenant_id,
                chain_seq__isnull=True,
                id__gt=head.chained_through,
                id__lte=settled,
            ).order_by("id")[:size]
        )
        seq, prev_hash = head.seq, head.hash
        links = []
        for event in events:
            seq += 1
            digest = event.chain_hash(chain_seq=seq, prev_hash=prev_hash)
            links.append((event.pk, seq, digest, prev_hash))
            prev_hash = digest
        _audit_chain_write(links)
        complete = len(events) < size
        # Complete: every settled id is chained. Otherwise: up to the last one chained.
        last = events[-1].pk if events else head.chained_through
        through = settled if complete else last
        # Never backwards: a caller whose own transaction is writing audit events sees a
        # higher watermark than the others (its own events are visible to it).
        through = max(head.chained_through, through)
        if links or through != head.chained_through:
            head.seq, head.hash, head.chained_through = seq, prev_hash, through
            head.save(update_fields=["seq", "hash", "chained_through", "updated_at"])
    return len(events), through, complete


def _audit_chain_write(links: list[tuple[int, int, str, str]]) -> None:
    """Set the chain columns: the one UPDATE the append-only trigger allows, once."""
    if not links:
        return
    table = AuditEvent._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            ids, seqs, hashes, prev_hashes = (list(column) for column in zip(*links, strict=True))
            cursor.execute(
                f"""UPDATE {table} AS e
                       SET chain_seq = v.seq, hash = v.hash, prev_hash = v.prev_hash
                      FROM unnest(%s::bigint[], %s::bigint[], %s::varchar[], %s::varchar[])
                           AS v(id, seq, hash, prev_hash)
                     WHERE e.id = v.id AND e.chain_seq IS NULL""",  # noqa: S608 (table name)
                [ids, seqs, hashes, prev_hashes],
            )
            updated = cursor.rowcount
        else:
            cursor.executemany(
                f"UPDATE {table} SET chain_seq = %s, hash = %s, prev_hash = %s"  # noqa: S608
                " WHERE id = %s AND chain_seq IS NULL",
                [(seq, digest, prev, pk) for pk, seq, digest, prev in links],
            )
            updated = len(links)
    if updated != len(links):
        raise RuntimeError(f"chained {updated} of {len(links)} audit events")


def audit_tenants_unchained() -> list[int]:
    """Ids of the tenants that have audit events not chained yet."""
    return list(
        AuditEvent.objects.filter(chain_seq__isnull=True)
        .order_by()
        .values_list("tenant_id", flat=True)
        .distinct()
    )


# An event still unchained this long after it was written is reported: the chain
# extension runs every few seconds.
AUDIT_UNCHAINED_GRACE = timedelta(minutes=1)


@dataclass(frozen=True)
class ChainProblem:
    """The first thing wrong with a tenant's chain, and the event it names."""

    kind: Literal["edited", "deleted", "inserted", "unchained"]
    event_pk: int | None
    message: str


@dataclass(frozen=True)
class ChainReport:
    tenant: Tenant
    chained: int
    head_hash: str
    unchained: int
    problem: ChainProblem | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def _named(event: AuditEvent) -> str:
    seq = f", chain_seq {event.chain_seq}" if event.chain_seq is not None else ""
    return f"event #{event.pk} ({event.kind}, event_id {event.event_id}{seq})"


def audit_chain_verify(*, tenant: Tenant, now: datetime | None = None) -> ChainReport:
    """Walk the tenant's chain in ``chain_seq`` order and report the first event that was
    edited (its hash does not match its content), deleted (a gap in ``chain_seq``, or the
    chain ends before its head), or inserted (an event whose ``prev_hash`` is not its
    predecessor's hash, one chained beyond the head, or an unchained event with an id the
    chain already covers). An event unchained for longer than ``AUDIT_UNCHAINED_GRACE``
    is reported as ``unchained``. Reads in constant memory."""
    now = now or timezone.now()
    head = AuditChainHead.objects.filter(tenant=tenant).first()
    chained = 0
    prev_hash = AUDIT_CHAIN_GENESIS
    prev: AuditEvent | None = None
    problem: ChainProblem | None = None
    walk = AuditEvent.objects.filter(tenant=tenant, chain_seq__isnull=False).order_by("chain_seq")
    for event in walk.iterator(chunk_size=2000):
        problem = _link_problem(event, prev, chained + 1, prev_hash)
        if problem is not None:
            break
        chained += 1
        prev_hash = event.hash or ""
        prev = event
    head_seq = head.seq if head is not None else 0
    if problem is None and head is None and chained:
        problem = ChainProblem(
            "deleted",
            None,
            f"{chained} events are chained but the chain's head (its newest link, kept apart"
            " from the events) was deleted",
        )
    elif problem is None and head_seq > chained:
        problem = ChainProblem(
            "deleted",
            None,
            f"the chain ends at chain_seq {chained} but its head records chain_seq {head_seq}:"
            f" the newest {head_seq - chained} event(s) of the chain were deleted",
        )
    elif problem is None and head is not None and head_seq == chained and head.hash != prev_hash:
        problem = ChainProblem(
            "edited",
            prev.pk if prev is not None else None,
            f"the head of the chain records hash {head.hash[:16]}… for chain_seq {head_seq}"
            f" but {_named(prev) if prev else 'the chain'} has {prev_hash[:16]}…",
        )
    elif problem is None and head_seq < chained:
        problem = ChainProblem(
            "inserted",
            prev.pk if prev is not None else None,
            f"events chained beyond the head (chain_seq {head_seq + 1} to {chained}), the last"
            f" {_named(prev) if prev else ''}: inserted with forged chain columns",
        )
    unchained = AuditEvent.objects.filter(tenant=tenant, chain_seq__isnull=True)
    if problem is None and head is not None:
        behind = unchained.filter(id__lte=head.chained_through).order_by("id").first()
        if behind is not None:
            problem = ChainProblem(
                "inserted",
                behind.pk,
                f"{_named(behind)} is not chained although the chain covers every event up to"
                f" #{head.chained_through}: it was inserted afterwards with an old id",
            )
    if problem is None:
        stale = unchained.filter(ingested_at__lt=now - AUDIT_UNCHAINED_GRACE).order_by("id")
        late = stale.first()
        if late is not None:
            problem = ChainProblem(
                "unchained",
                late.pk,
                f"{_named(late)}, written at {late.ingested_at.isoformat()}, is still not"
                " chained: inserted outside the console, or a transaction that writes audit"
                " events has been open since then (the chain waits for it), or the chain"
                " extension (approvals.tasks.audit_chain_extend_all) is not running",
            )
    return ChainReport(
        tenant=tenant,
        chained=chained,
        head_hash=prev_hash,
        unchained=unchained.count(),
        problem=problem,
    )


def _link_problem(
    event: AuditEvent, prev: AuditEvent | None, expected_seq: int, prev_hash: str
) -> ChainProblem | None:
    after = f"event #{prev.pk}" if prev is not None else "the start of the chain"
    if event.chain_seq != expected_seq:
        missing = (
            f"chain_seq {expected_seq}"
            if event.chain_seq == expected_seq + 1
            else f"chain_seq {expected_seq} to {(event.chain_seq or 0) - 1}"
        )
        return ChainProblem(
            "deleted",
            event.pk,
            f"{missing} missing between {after} and {_named(event)}: deleted",
        )
    computed = event.chain_hash(chain_seq=expected_seq, prev_hash=event.prev_hash or "")
    if computed != event.hash:
        return ChainProblem(
            "edited",
            event.pk,
            f"{_named(event)} was edited: its content no longer hashes to its stored hash"
            f" ({(event.hash or '')[:16]}… stored, {computed[:16]}… now)",
        )
    if event.prev_hash != prev_hash:
        return ChainProblem(
            "inserted",
            event.pk,
            f"{_named(event)} does not follow {after}: its prev_hash is not that event's hash,"
            " so an event was inserted (or replaced) here",
        )
    if prev is not None and event.pk <= prev.pk:
        return ChainProblem(
            "inserted",
            event.pk,
            f"{_named(event)} is chained after {after}, which has a higher id: inserted",
        )
    return None
