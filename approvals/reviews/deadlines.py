"""Deadlines of a pending request: nothing waits for ever.

A contract may set a review deadline and a final deadline (``ToolContract``); a proposal
writes them down on its occurrence as instants of the database's clock
(``review_deadline_at``, ``final_deadline_at``). Past the review deadline the request is
*escalated*: marked (``escalated_at``, audited ``occurrence.escalated``) and still
reviewable. Past the final deadline it ends ``timed_out``: a decision of its own, audited
``occurrence.timed_out`` by the actor ``console``, told to the runtime's callback
(``timed_out``), fail-closed: the review services refuse to decide it
(``ErrorCode.TIMED_OUT``) from the instant the deadline passes, before the sweep writes
it down, so a request whose final deadline passed is never approved. ``approvals.metrics``
counts both from their audit events (``console_review_deadlines``).

The sweep (Celery beat, ``approvals.tasks.review_deadlines_sweep``) writes down what the
clock decided, in bounded batches; each change is a conditional UPDATE on the status, so a
run twice, two sweeps, or a reviewer deciding at the same instant leave exactly one
decision. An escalation tells the routing rule's fallback group, a timeout the routed
groups' channels (``approvals.notifications``), through the outbox written in the same
transaction.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import transaction

from approvals.audit.record import DbNow, audit_record, db_now
from approvals.callbacks.outbox import callback_delivery_create
from approvals.errors import ErrorCode, ServiceError
from approvals.models import NotificationEvent, Occurrence, ToolContract
from approvals.notifications.outbox import notification_event_create
from approvals.vocabulary import AuditKind, EventDecision, EventReason

# The actor of an escalation and a timeout: the console itself, on its clock.
ACTOR = "console"
# One sweep takes at most this many requests of each kind; the next run takes the rest.
DEADLINES_BATCH = 200


def deadlines_from(contract: ToolContract, now: datetime) -> dict[str, datetime | None]:
    """The deadline fields of a new pending occurrence proposed at ``now``."""
    review, final = contract.review_deadline, contract.final_deadline
    return {
        "review_deadline_at": now + review if review is not None else None,
        "final_deadline_at": now + final if final is not None else None,
    }


def deadlines_now(contract: ToolContract) -> dict[str, datetime | None]:
    """The deadline fields of a new pending occurrence proposed now, on the database's
    clock. A contract without deadlines has none to write, and its proposal does not ask
    the database for the time (a round trip on every proposal)."""
    if contract.review_deadline is None and contract.final_deadline is None:
        return {}
    return deadlines_from(contract, db_now())


def require_before_final_deadline(occurrence: Occurrence, now: datetime) -> None:
    """Refuse a decision on a request that timed out, or whose final deadline has passed
    though the sweep has not written it down yet (fail-closed: the clock decided)."""
    timed_out = occurrence.status == Occurrence.Status.TIMED_OUT
    due = occurrence.status == Occurrence.Status.PENDING_REVIEW and (
        occurrence.final_deadline_at is not None and occurrence.final_deadline_at <= now
    )
    if timed_out or due:
        deadline = occurrence.final_deadline_at
        raise ServiceError(
            ErrorCode.TIMED_OUT,
            "Nobody decided this request before its final deadline: it timed out, and "
            "nothing can approve it now. The agent may propose the action again.",
            details={"final_deadline_at": deadline.isoformat() if deadline else None},
        )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def occurrence_escalate(occurrence_id: uuid.UUID | str) -> bool:
    """Mark a pending request whose review deadline passed as escalated, once. Returns
    whether this call did (False: not due, already escalated, or decided meanwhile)."""
    with transaction.atomic():
        changed = Occurrence.objects.filter(
            pk=occurrence_id,
            status=Occurrence.Status.PENDING_REVIEW,
            escalated_at__isnull=True,
            review_deadline_at__lte=DbNow(),
        ).update(escalated_at=DbNow(), updated_at=DbNow())
        if not changed:
            return False
        occ = Occurrence.objects.values("tenant_id", "review_deadline_at", "escalated_at").get(
            pk=occurrence_id
        )
        audit_record(
            kind=AuditKind.OCCURRENCE_ESCALATED,
            tenant=occ["tenant_id"],
            occurrence=uuid.UUID(str(occurrence_id)),
            actor=ACTOR,
            decision=EventDecision.ESCALATED,
            reason_code=EventReason.REVIEW_DEADLINE_PASSED,
            data={
                "deadline": "review",
                "review_deadline_at": _iso(occ["review_deadline_at"]),
                "escalated_at": _iso(occ["escalated_at"]),
            },
        )
        notification_event_create(
            tenant_id=occ["tenant_id"],
            occurrence_id=occurrence_id,
            kind=NotificationEvent.Kind.ESCALATED,
        )
    return True


def occurrence_time_out(occurrence_id: uuid.UUID | str) -> bool:
    """End a pending request whose final deadline passed as ``timed_out``, once. Returns
    whether this call did. The UPDATE is conditional on the status: a reviewer's decision
    holding the row waits this out or makes it change nothing (exactly one wins)."""
    with transaction.atomic():
        changed = Occurrence.objects.filter(
            pk=occurrence_id,
            status=Occurrence.Status.PENDING_REVIEW,
            final_deadline_at__lte=DbNow(),
        ).update(status=Occurrence.Status.TIMED_OUT, decided_at=DbNow(), updated_at=DbNow())
        if not changed:
            return False
        occ = Occurrence.objects.values("tenant_id", "final_deadline_at", "decided_at").get(
            pk=occurrence_id
        )
        callback_delivery_create(
            audit_record(
                kind=AuditKind.OCCURRENCE_TIMED_OUT,
                tenant=occ["tenant_id"],
                occurrence=uuid.UUID(str(occurrence_id)),
                actor=ACTOR,
                decision=EventDecision.TIMED_OUT,
                reason_code=EventReason.FINAL_DEADLINE_PASSED,
                data={
                    "deadline": "final",
                    "final_deadline_at": _iso(occ["final_deadline_at"]),
                    "timed_out_at": _iso(occ["decided_at"]),
                },
            )
        )
        notification_event_create(
            tenant_id=occ["tenant_id"],
            occurrence_id=occurrence_id,
            kind=NotificationEvent.Kind.DECIDED,
            outcome=Occurrence.Status.TIMED_OUT,
        )
    return True


def review_deadlines_apply(batch: int = DEADLINES_BATCH) -> tuple[int, int]:
    """One sweep: escalate, then time out, up to ``batch`` due requests each, oldest
    deadline first. Returns (escalated, timed out). Idempotent: what another sweep or a
    reviewer changed meanwhile is left as it is."""
    pending = Occurrence.objects.filter(status=Occurrence.Status.PENDING_REVIEW)
    to_escalate = list(
        pending.filter(escalated_at__isnull=True, review_deadline_at__lte=DbNow())
        .order_by("review_deadline_at")
        .values_list("pk", flat=True)[:batch]
    )
    escalated = sum(occurrence_escalate(pk) for pk in to_escalate)
    to_time_out = list(
        pending.filter(final_deadline_at__lte=DbNow())
        .order_by("final_deadline_at")
        .values_list("pk", flat=True)[:batch]
    )
    timed_out = sum(occurrence_time_out(pk) for pk in to_time_out)
    return escalated, timed_out
