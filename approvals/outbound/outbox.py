"""Trying an outbox row until it is delivered: lease it, send it once outside any
transaction, record the attempt, and either settle it or schedule the next try after 2,
4, 8 … backoff units. Callbacks (``approvals.callbacks.delivery``) and notifications
(``approvals.notifications.delivery``) both send through here; each says only how one of
its rows is sent (``send``) and how often it may be tried.

Delivery is at least once: a worker that dies mid-send leaves the row leased, and the
sweep (``rows_due``) tries it again once the lease ran out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import structlog
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models.outbox import OutboxAttempt, OutboxDelivery

log = structlog.get_logger("approvals.outbound")

LEASE = timedelta(seconds=60)

Row = TypeVar("Row", bound=OutboxDelivery)


class Sent(NamedTuple):
    """What one send did: ``error`` empty when it was delivered; ``give_up`` when no
    later attempt can do better (the target was removed)."""

    status_code: int | None = None
    error: str = ""
    give_up: bool = False


class Attempt(NamedTuple):
    """What one attempt did: ``outcome`` is delivered, retry, failed, or skipped (not due,
    leased, already done); ``retry_in``, for a retry, the seconds until the next one."""

    outcome: str
    retry_in: float | None = None


def backoff(attempts: int, unit_seconds: float) -> timedelta:
    """The wait after ``attempts`` failed attempts: 1, 2, 4 … units."""
    return timedelta(seconds=unit_seconds * 2 ** max(attempts - 1, 0))


def attempt_once(
    *,
    rows: type[Row],
    attempts: type[OutboxAttempt],
    pk: Any,
    send: Callable[[Row], Sent],
    max_attempts: int,
    backoff_seconds: float,
    related: Sequence[str] = (),
    due: Q | None = None,
) -> Attempt:
    """One attempt at one row, if it is due and nobody else holds it. ``send`` runs outside
    any transaction; whoever called publishes the retry (the task of the row's kind)."""
    now = timezone.now()
    leased = (
        rows._default_manager.filter(
            Q(leased_until__isnull=True) | Q(leased_until__lt=now),
            pk=pk,
            state=OutboxDelivery.State.PENDING,
            next_attempt_at__lte=now,
        )
        .filter(due or Q())
        .update(leased_until=now + LEASE)
    )
    if not leased:
        return Attempt("skipped")
    row = rows._default_manager.select_related(*related).get(pk=pk)
    return _send_and_record(row, _Trying(attempts, send, max_attempts, backoff_seconds))


def attempt_leased(
    *,
    row: Row,
    attempts: type[OutboxAttempt],
    send: Callable[[Row], Sent],
    max_attempts: int,
    backoff_seconds: float,
) -> Attempt:
    """One attempt at a row its caller wrote already leased (``row.leased_until`` set in
    the transaction that inserted it), so neither leased nor read again here: the row in
    hand is the row as written. Should less than half the lease be left (a slow send before
    this one), the lease is renewed first, on condition that it is still the one written;
    a row whose lease ran out and was taken by the sweep is skipped."""
    now = timezone.now()
    if row.leased_until is None or now >= row.leased_until - LEASE / 2:
        renewed = (
            type(row)
            ._default_manager.filter(
                pk=row.pk, state=OutboxDelivery.State.PENDING, leased_until=row.leased_until
            )
            .update(leased_until=now + LEASE)
        )
        if not renewed:
            return Attempt("skipped")
        row.leased_until = now + LEASE
    return _send_and_record(row, _Trying(attempts, send, max_attempts, backoff_seconds))


class _Trying(NamedTuple):
    """How a kind of row is tried: its attempts' model, its send, its limits."""

    attempts: type[OutboxAttempt]
    send: Callable[[Any], Sent]
    max_attempts: int
    backoff_seconds: float


def _send_and_record(row: OutboxDelivery, trying: _Trying) -> Attempt:
    """Send the leased ``row`` once outside any transaction, then record the attempt and
    settle the row (or schedule its next try) in one transaction."""
    attempts, send, max_attempts, backoff_seconds = trying
    rows, pk = type(row), row.pk
    number = row.attempts + 1
    started = timezone.now()
    sent = send(row)
    finished = timezone.now()
    delivered = not sent.error
    final = delivered or sent.give_up or number >= max_attempts
    wait = backoff(number, backoff_seconds)
    state = (
        OutboxDelivery.State.DELIVERED
        if delivered
        else (OutboxDelivery.State.FAILED if final else OutboxDelivery.State.PENDING)
    )
    record = _Record(
        number=number,
        started_at=started,
        finished_at=finished,
        status_code=sent.status_code,
        error=sent.error,
        state=state,
        delivered_at=finished if delivered else None,
        next_attempt_at=finished if final else finished + wait,
    )
    if connection.vendor == "postgresql":
        _record_sql(row, attempts, record)
    else:
        _record_orm(row, attempts, record)
    row.attempts, row.state, row.leased_until = number, state, None
    outcome = "delivered" if delivered else ("failed" if final else "retry")
    log.info(
        "outbox.attempt",
        rows=rows.__name__,
        delivery_id=str(pk),
        attempt=number,
        status_code=sent.status_code,
        outcome=outcome,
    )
    if outcome == "retry":
        return Attempt(outcome, wait.total_seconds())
    return Attempt(outcome)


class _Record(NamedTuple):
    """An attempt as it went, and the row as it is left."""

    number: int
    started_at: datetime
    finished_at: datetime
    status_code: int | None
    error: str
    state: str
    delivered_at: datetime | None
    next_attempt_at: datetime


# The attempt's INSERT and the row's UPDATE in one statement (PostgreSQL runs a
# data-modifying WITH as one: both or neither), instead of BEGIN, INSERT, UPDATE, COMMIT.
_RECORD = """
    WITH attempt AS (
        INSERT INTO {attempts} ({delivery}, number, started_at, finished_at, status_code, error)
        VALUES (%s, %s, %s, %s, %s, %s)
    )
    UPDATE {rows}
       SET attempts = %s, state = %s, leased_until = NULL, delivered_at = %s,
           next_attempt_at = %s, last_error = %s
     WHERE {pk} = %s
"""


def _record_sql(row: OutboxDelivery, attempts: type[OutboxAttempt], record: _Record) -> None:
    """Record the attempt and settle the row: one statement (its ORM twin ``_record_orm``
    runs on SQLite; ``tests/approvals/test_notification_dispatch.py`` holds them equal)."""
    rows = type(row)
    sql = _RECORD.format(
        attempts=connection.ops.quote_name(attempts._meta.db_table),
        # Every concrete attempt model has its ``delivery`` (the abstract one cannot).
        delivery=connection.ops.quote_name(
            attempts._meta.get_field("delivery").column  # type: ignore[misc]
        ),
        rows=connection.ops.quote_name(rows._meta.db_table),
        pk=connection.ops.quote_name(rows._meta.pk.column),  # type: ignore[union-attr]
    )
    r = record
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            [
                *(row.pk, r.number, r.started_at, r.finished_at, r.status_code, r.error),
                *(r.number, r.state, r.delivered_at, r.next_attempt_at, r.error, row.pk),
            ],
        )


def _record_orm(row: OutboxDelivery, attempts: type[OutboxAttempt], record: _Record) -> None:
    """``_record_sql`` through the ORM, in one transaction."""
    r = record
    with transaction.atomic():
        # Every concrete attempt model has its ``delivery`` (the abstract one cannot).
        attempts._default_manager.create(  # type: ignore[misc]
            delivery=row,
            number=r.number,
            started_at=r.started_at,
            finished_at=r.finished_at,
            status_code=r.status_code,
            error=r.error,
        )
        type(row)._default_manager.filter(pk=row.pk).update(
            attempts=r.number,
            state=r.state,
            leased_until=None,
            delivered_at=r.delivered_at,
            next_attempt_at=r.next_attempt_at,
            last_error=r.error,
        )


def rows_due(
    rows: type[OutboxDelivery], *, grace_seconds: float, limit: int = 500, due: Q | None = None
) -> list[str]:
    """Pending rows whose time has come and that nobody holds: those whose task was lost
    (a broker that was down at commit, a worker that died mid-send)."""
    now = timezone.now()
    return [
        str(pk)
        for pk in rows._default_manager.filter(
            Q(leased_until__isnull=True) | Q(leased_until__lt=now),
            state=OutboxDelivery.State.PENDING,
            next_attempt_at__lte=now - timedelta(seconds=grace_seconds),
        )
        .filter(due or Q())
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    ]
