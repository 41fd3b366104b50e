"""The duplicated audit delivery story: one producer event that reached the audit trail more
than once. It records one decision; counting its rows would overstate what happened."""

from __future__ import annotations

from collections import Counter, defaultdict

from reconciliation.investigations.facts import DeliveryFact, Facts
from reconciliation.investigations.wording import listing, short, times, when


def duplicated_delivery(facts: Facts) -> list[str]:
    lines: list[str] = []
    later: dict[int, list[DeliveryFact]] = defaultdict(list)
    for delivery in facts.deliveries:
        later[delivery.original_pk].append(delivery)
    rows = Counter((e.tenant_id, e.event_id) for e in facts.events)
    described: set[tuple[int, str]] = set()
    for event in facts.events:
        key = (event.tenant_id, event.event_id)
        again = later.get(event.pk, [])
        if key in described or (not again and rows[key] < 2):
            continue
        described.add(key)
        what = ", ".join(x for x in (event.kind, event.decision, event.execution_id) if x)
        copies = rows[key] + sum(d.copies for d in again)
        first = (
            f"stored once from batch #{event.ingestion_id} at {when(event.ingested_at)}"
            if event.ingestion_id is not None
            else f"written by this console at {when(event.ingested_at or event.source_time)}"
        )
        repeats = [
            f"batch #{d.ingestion_id} at {when(d.received_at)} (line {d.line}"
            f"{f' and {d.copies - 1} more' if d.copies > 1 else ''}, "
            f"{'same content' if d.same_payload else 'different content'})"
            for d in again
        ]
        if rows[key] > 1:
            repeats.append(f"{rows[key]} stored rows carry this id")
        lines.append(
            f"Producer event {event.event_id} ({what}) was delivered {times(copies)}: "
            f"{first}; again in {listing(repeats)}."
        )
        if any(not d.same_payload for d in again):
            lines.append(
                f"A later delivery of {short(event.event_id)} says something else than the "
                "stored event: its producer reused an event id; ask that producer."
            )
    if lines:
        lines.append(
            "Each producer event is counted once here: the copies are one decision each, "
            "not several."
        )
    return lines
