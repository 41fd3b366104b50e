""" "I'm on it": an operator takes an occurrence of the operators' queue, so that the others
see who works on it. A take is one row per occurrence (``QueueTake``) whose holder moves
only by a compare-and-set: the update names the holder and times it read, and its row
count decides. Of two operators taking the same item at once, one wins and the other is
told who has it.

A take lapses ``OPERATIONS_TAKE_MINUTES`` after it was taken or last renewed (taking it
again renews it), by the database's clock; nothing needs to run for that, as every reader
compares ``expires_at`` with the database's ``now``. The holder may let it go, another
operator may take it over (their form names the holder their page showed), and a decision
that resolves the item lets it go (``take_release_on_resolve``, from
``reconciliation.operator_actions``). Each move is an audit event of the occurrence.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from approvals.audit.record import audit_record, db_now
from approvals.errors import ErrorCode, ServiceError
from approvals.models import Occurrence
from approvals.vocabulary import AuditKind, EventDecision, EventReason
from reconciliation.models import QueueTake


@dataclass(frozen=True)
class Holder:
    """Who is on an item, as the queue and the timeline show it."""

    user_id: int
    name: str
    taken_at: datetime
    expires_at: datetime

    def minutes(self, now: datetime) -> int:
        return max(int((now - self.taken_at).total_seconds() // 60), 0)


@dataclass(frozen=True)
class Taken:
    holder: Holder
    message: str


def holder_of(take: QueueTake | None, now: datetime) -> Holder | None:
    """The live holder of ``take`` at ``now`` (None: nobody, or the take lapsed)."""
    if take is None or take.holder_id is None or take.expires_at is None or take.taken_at is None:
        return None
    if take.expires_at <= now:
        return None
    return Holder(take.holder_id, take.holder_name, take.taken_at, take.expires_at)


def take_holder(*, occurrence_id: Any) -> tuple[Holder | None, datetime]:
    """Who is on the occurrence now, and the database's now it was read at."""
    now = db_now()
    return holder_of(QueueTake.objects.filter(occurrence_id=occurrence_id).first(), now), now


def display_name(user: Any) -> str:
    return (user.get_short_name() or user.get_username())[:150]


def _since(holder: Holder, now: datetime) -> str:
    minutes = holder.minutes(now)
    return (
        f"since {holder.taken_at.astimezone(UTC):%H:%M} UTC "
        f"({minutes} min{'' if minutes == 1 else 's'})"
    )


def _occurrence(occurrence_id: Any, tenant_ids: list[int]) -> Occurrence:
    occurrence = (
        Occurrence.objects.filter(pk=occurrence_id, tenant_id__in=tenant_ids)
        .only("pk", "tenant_id")
        .first()
    )
    if occurrence is None:
        raise ServiceError(ErrorCode.NOT_FOUND, "No such occurrence in your tenants.", 404)
    return occurrence


def _as_read(take: QueueTake) -> dict[str, Any]:
    """The row's holder and times as read: what a compare-and-set names."""
    return {
        "pk": take.pk,
        "holder_id": take.holder_id,
        "taken_at": take.taken_at,
        "expires_at": take.expires_at,
    }


def _taken_by_other(holder: Holder, now: datetime) -> ServiceError:
    return ServiceError(
        ErrorCode.TAKEN_BY_OTHER,
        f"{holder.name} is on it {_since(holder, now)}. Nothing changed: take it over if "
        f"{holder.name} is no longer working on it.",
        409,
        details={"holder": holder.name, "taken_at": holder.taken_at.isoformat()},
    )


def occurrence_take(
    *,
    occurrence_id: Any,
    tenant_ids: list[int],
    user: Any,
    take_over: Any = None,
) -> Taken:
    """Take the occurrence ("I'm on it"), or renew one's own take. An item another
    operator holds is refused with who has it, unless ``take_over`` names that very
    holder (the user id the page showed): then it is taken over from them. A lapsed take
    is anyone's."""
    occurrence = _occurrence(occurrence_id, tenant_ids)
    name = display_name(user)
    with transaction.atomic():
        QueueTake.objects.bulk_create(
            [QueueTake(occurrence_id=occurrence.pk, tenant_id=occurrence.tenant_id)],
            ignore_conflicts=True,
        )
        take = QueueTake.objects.get(occurrence_id=occurrence.pk)
        now = db_now()
        before = holder_of(take, now)
        if (
            before is not None
            and before.user_id != user.pk
            and str(take_over) != str(before.user_id)
        ):
            raise _taken_by_other(before, now)
        renewing = before is not None and before.user_id == user.pk
        taken_at = before.taken_at if renewing and before else now
        expires_at = now + timedelta(minutes=settings.OPERATIONS_TAKE_MINUTES)
        won = QueueTake.objects.filter(**_as_read(take)).update(
            holder_id=user.pk, holder_name=name, taken_at=taken_at, expires_at=expires_at
        )
        if not won:
            # Someone moved it between the read and the update: say who has it now.
            now = db_now()
            current = holder_of(QueueTake.objects.get(pk=take.pk), now)
            if current is not None and current.user_id == user.pk:
                # One's own other request (a double click) took it first: it is theirs.
                return Taken(current, "You are on it.")
            if current is not None:
                raise _taken_by_other(current, now)
            raise ServiceError(
                ErrorCode.STATE_CHANGED,
                "Someone changed who is on it at the same moment: look again and decide.",
                409,
            )
        holder = Holder(user.pk, name, taken_at, expires_at)
        if renewing:
            return Taken(holder, f"You are still on it, until {expires_at:%H:%M} UTC.")
        over = before is not None
        audit_record(
            kind=AuditKind.OPERATIONS_TAKEN_OVER if over else AuditKind.OPERATIONS_TAKEN,
            tenant=occurrence.tenant_id,
            occurrence=occurrence.pk,
            actor=user.get_username(),
            decision=EventDecision.TAKEN_OVER if over else EventDecision.TAKEN,
            data={
                "holder": name,
                "until": expires_at.isoformat(),
                **(
                    {"from": before.name, "from_since": before.taken_at.isoformat()}
                    if before
                    else {}
                ),
            },
        )
    if before is not None:
        return Taken(
            holder, f"You took it over from {before.name}, who had it {_since(before, now)}."
        )
    minutes = settings.OPERATIONS_TAKE_MINUTES
    return Taken(
        holder, f"You are on it. It stays yours for {minutes} minutes unless you take it again."
    )


def occurrence_release(*, occurrence_id: Any, tenant_ids: list[int], user: Any) -> str:
    """Let one's own take go; refused (with who has it) when it is not one's own."""
    occurrence = _occurrence(occurrence_id, tenant_ids)
    with transaction.atomic():
        now = db_now()
        released = QueueTake.objects.filter(
            occurrence_id=occurrence.pk, holder_id=user.pk, expires_at__gt=now
        ).update(holder=None, holder_name="", taken_at=None, expires_at=None)
        if not released:
            current = holder_of(QueueTake.objects.filter(occurrence_id=occurrence.pk).first(), now)
            who = f"{current.name} is on it {_since(current, now)}" if current else "nobody is"
            raise ServiceError(
                ErrorCode.NOT_HOLDER,
                f"You are not on it ({who}). Nothing changed.",
                409,
            )
        audit_record(
            kind=AuditKind.OPERATIONS_RELEASED,
            tenant=occurrence.tenant_id,
            occurrence=occurrence.pk,
            actor=user.get_username(),
            decision=EventDecision.RELEASED,
            reason_code=EventReason.LET_GO,
        )
    return "You let it go: it is unowned now."


def take_release_on_resolve(
    *, occurrence_id: Any, tenant_id: int, operator: str, decision: Any
) -> None:
    """A decision resolved the item: whoever was on it is no longer (inside the decision's
    transaction, so both happen or neither)."""
    now = db_now()
    take = QueueTake.objects.filter(occurrence_id=occurrence_id, holder__isnull=False).first()
    if take is None:
        return
    held = holder_of(take, now)
    if not QueueTake.objects.filter(**_as_read(take)).update(
        holder=None, holder_name="", taken_at=None, expires_at=None
    ):
        return  # taken or let go meanwhile: that move stands, and its event says so
    if held is None:
        return  # it had lapsed already: nobody was on it
    audit_record(
        kind=AuditKind.OPERATIONS_RELEASED,
        tenant=tenant_id,
        occurrence=occurrence_id,
        actor=operator,
        decision=EventDecision.RELEASED,
        reason_code=EventReason.RESOLVED,
        data={"holder": held.name, "decision": decision},
    )
