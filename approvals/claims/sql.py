"""The two statements at the heart of a claim, written out in SQL.

``approvals.claims.claim.approval_claim`` decides; this module only talks to the database. The
guard is an ``UPDATE ... RETURNING``, which Django's ORM cannot express: the row it returns
is what admits a claim, so no read precedes the write. The read that names a refusal
compares expiry with the same database clock the guard used. Both run on PostgreSQL and
SQLite; everything else a claim writes goes through the ORM.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Model

from approvals.models import Approval, AuditEvent, Command, Epoch, Occurrence

# The database's clock, as ``approvals.audit.record.DbNow`` reads it: on PostgreSQL the
# transaction's start, so that the guard and the read that explains a refusal judge expiry at one
# instant; on SQLite (which runs in this process) Django's own ``Now()``. ``%%`` because the
# statements go through the DB-API's ``%s`` parameter style.
_NOW = {
    "postgresql": "CURRENT_TIMESTAMP",
    "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')",
}


def _sql(template: str) -> str:
    return template.format(
        approval=Approval._meta.db_table,
        epoch=Epoch._meta.db_table,
        now=_NOW[connection.vendor],
    )


def _uuid(value: Any) -> uuid.UUID:
    # SQLite hands UUID columns back as hex text.
    return value if isinstance(value, uuid.UUID) else uuid.UUID(value)


# --- the guard ----------------------------------------------------------------------------


class Consumed(NamedTuple):
    approval_id: int
    occurrence_id: uuid.UUID
    fingerprint: str
    epochs: int  # epochs of the occurrence before this claim


# The one statement that decides a claim. RETURNING hands back the row it consumed, so no
# read precedes the guard and no read-then-write window can exist. The epoch count rides
# along; a concurrent epoch insert would make the epoch INSERT fail on its unique
# constraint, never produce a second command.
_CONSUME = """
    UPDATE {approval}
       SET state = %s, consumed_at = {now}, consumed_by_execution = %s
     WHERE tenant_id = %s AND token_hash = %s AND state = %s AND action_digest = %s
       AND superseded_at IS NULL AND expires_at > {now}
       AND (bound_execution_id = '' OR bound_execution_id = %s)
 RETURNING id, occurrence_id, fingerprint,
           (SELECT COUNT(*) FROM {epoch} WHERE {epoch}.occurrence_id = {approval}.occurrence_id)
           AS epochs
"""


def consume(*, tenant_id: int, token_hash: str, digest: str, execution_id: str) -> Consumed | None:
    """Consume the approval if it is issued, in scope and in time; return what was consumed,
    or None if nothing was."""
    params = (
        Approval.State.CONSUMED.value,
        execution_id,
        tenant_id,
        token_hash,
        Approval.State.ISSUED.value,
        digest,
        execution_id,
    )
    with connection.cursor() as cursor:
        cursor.execute(_sql(_CONSUME), params)
        row = cursor.fetchone()
    if row is None:
        return None
    approval_id, occurrence_id, fingerprint, epochs = row
    return Consumed(approval_id, _uuid(occurrence_id), fingerprint, epochs)


# --- the guard and what it admits, in one statement (PostgreSQL) ---------------------------

# Where each row an admitted claim writes takes a value only the guard knows (the consumed
# approval's id, occurrence and fingerprint, and the epoch's number): SQL over ``g``, the
# guard's RETURNING row, with its parameters. Every other column is the unsaved model
# instance's own value, prepared by its field as a save would prepare it.
_FromGuard = dict[str, tuple[str, list[Any]]]


def _insert_from_guard(model: type[Model], instance: Model, from_guard: _FromGuard) -> Any:
    """``INSERT INTO <table> (<columns>) SELECT <values> FROM g``: the row ``instance``
    would be, with the ``from_guard`` columns taken from the guard's row. A column left to
    the database (an auto-incrementing key) is left out."""
    columns, values, params = [], [], []
    for field in model._meta.concrete_fields:
        if field.attname in from_guard:
            sql, field_params = from_guard[field.attname]
            values.append(sql)
            params += field_params
        else:
            value = field.pre_save(instance, add=True)
            if value is None and field.primary_key:
                continue  # the database's sequence numbers it
            values.append("%s")
            params.append(field.get_db_prep_save(value, connection))
        columns.append(connection.ops.quote_name(field.column))
    table = connection.ops.quote_name(model._meta.db_table)
    insert = f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)} FROM g"  # noqa: S608 (names from the models, values as parameters)
    return insert, params


def claim_one_statement() -> bool:
    """Whether ``consume_and_write`` runs here: on PostgreSQL (SQLite has no data-modifying
    ``WITH``; there the claim writes through the ORM after ``consume``)."""
    return connection.vendor == "postgresql"


def consume_and_write(
    *,
    tenant_id: int,
    token_hash: str,
    digest: str,
    execution_id: str,
    epoch: Epoch,
    command: Command,
    event: AuditEvent,
    occurrence_status: tuple[str, str],
) -> Consumed | None:
    """The guard and everything an admitted claim writes, in one statement and one round
    trip: the conditional ``UPDATE`` of the approval, then, from the row it returns, the
    epoch, the command, the occurrence's status (``occurrence_status``: from, to) and the
    audit event, as data-modifying ``WITH`` queries of one statement. When the guard
    consumes nothing, nothing else is written either (each ``INSERT`` selects from its
    empty row), and the answer is None, as ``consume``'s.

    ``epoch``, ``command`` and ``event`` are unsaved instances (their own ids set), whose
    occurrence, approval, number and fingerprint the guard's row supplies; the event's
    ``data`` gets the epoch's number. PostgreSQL checks the foreign keys between them at the
    statement's end, and a concurrent epoch still fails the epoch's unique constraint."""
    guard_params = (
        Approval.State.CONSUMED.value,
        execution_id,
        tenant_id,
        token_hash,
        Approval.State.ISSUED.value,
        digest,
        execution_id,
    )
    occurrence: tuple[str, list[Any]] = ("g.occurrence_id", [])
    epoch_sql, epoch_params = _insert_from_guard(
        Epoch, epoch, {"occurrence_id": occurrence, "number": ("g.epochs + 1", [])}
    )
    command_sql, command_params = _insert_from_guard(
        Command, command, {"occurrence_id": occurrence, "approval_id": ("g.id", [])}
    )
    data = AuditEvent._meta.get_field("data").get_db_prep_save(event.data, connection)
    event_sql, event_params = _insert_from_guard(
        AuditEvent,
        event,
        {
            "occurrence_id": occurrence,
            "token_fingerprint": ("g.fingerprint", []),
            "data": ("%s::jsonb || jsonb_build_object('epoch', g.epochs + 1)", [data]),
        },
    )
    occurrence_table = connection.ops.quote_name(Occurrence._meta.db_table)
    statement = f"""
        WITH g AS ({_sql(_CONSUME)}),
             e AS ({epoch_sql} RETURNING 1),
             c AS ({command_sql} RETURNING 1),
             o AS (UPDATE {occurrence_table} SET status = %s, updated_at = CURRENT_TIMESTAMP
                     FROM g
                    WHERE {occurrence_table}.id = g.occurrence_id
                      AND {occurrence_table}.status = %s
                RETURNING 1),
             a AS ({event_sql} RETURNING 1)
        SELECT g.id, g.occurrence_id, g.fingerprint, g.epochs FROM g"""  # noqa: S608 (no input in the text)
    from_status, to_status = occurrence_status
    params = [
        *guard_params,
        *epoch_params,
        *command_params,
        to_status,
        from_status,
        *event_params,
    ]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    if row is None:
        return None
    approval_id, occurrence_id, fingerprint, epochs = row
    return Consumed(approval_id, _uuid(occurrence_id), fingerprint, epochs)


# --- explaining a refusal -------------------------------------------------------------------


class FoundApproval(NamedTuple):
    """An approval as a refused claim found it, after the guard."""

    id: int
    occurrence_id: uuid.UUID
    token_hash: str
    fingerprint: str
    state: str
    tool_name: str
    action_digest: str
    consumed_by_execution: str
    bound_execution_id: str  # "" unless a pickup bound the approval to an execution
    superseded: bool
    expired: bool  # expires_at has passed by the same clock the guard used


_FIND = """
    SELECT id, occurrence_id, token_hash, fingerprint, state, tool_name, action_digest,
           consumed_by_execution, bound_execution_id, superseded_at IS NOT NULL,
           expires_at <= {now}
      FROM {approval}
     WHERE tenant_id = %s AND token_hash = %s
"""


def find_approval(*, tenant_id: int, token_hash: str) -> FoundApproval | None:
    """The tenant's approval with this token hash, as it stands now, or None."""
    with connection.cursor() as cursor:
        cursor.execute(_sql(_FIND), (tenant_id, token_hash))
        row = cursor.fetchone()
    if row is None:
        return None
    (
        pk,
        occurrence_id,
        found_hash,
        fingerprint,
        state,
        tool,
        digest,
        execution,
        bound,
        sup,
        exp,
    ) = row
    return FoundApproval(
        pk,
        _uuid(occurrence_id),
        found_hash,
        fingerprint,
        state,
        tool,
        digest,
        execution,
        bound,
        bool(sup),  # SQLite answers 0 or 1
        bool(exp),
    )
