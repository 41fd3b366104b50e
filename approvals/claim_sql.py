"""The claim's statements, written out.

``approvals.services.approval_claim`` decides; this module only talks to the database. The
statements are the ones the ORM would send (the same tables, columns and stored values), but
written once instead of compiled on every call: building each query through Django's
compiler, and model instances to read rows into, cost a claim more CPU than the statements
themselves (``bench/claim_bench.py --profile``). Each function here runs one statement.

Everything is portable between PostgreSQL and SQLite: values are converted by the model's
own fields (``get_db_prep_save``), so UUIDs, datetimes and JSON are stored exactly as the
ORM stores them on either database.
"""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any, NamedTuple, TypeVar, cast

from django.db import connection, models

from approvals.models import Approval, Epoch, Occurrence, ToolContract

M = TypeVar("M", bound=models.Model)

# The database's clock, as ``services.DbNow`` reads it: on PostgreSQL the transaction's
# start, so that the guard and the read that explains a refusal judge expiry at one
# instant; on SQLite (which runs in this process) Django's own ``Now()``. ``%%`` because
# the statements go through the DB-API's ``%s`` parameter style.
_NOW = {
    "postgresql": "CURRENT_TIMESTAMP",
    "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')",
}


def _sql(template: str) -> str:
    return template.format(
        approval=Approval._meta.db_table,
        epoch=Epoch._meta.db_table,
        occurrence=Occurrence._meta.db_table,
        contract=ToolContract._meta.db_table,
        now=_NOW[connection.vendor],
    )


def _uuid(value: Any) -> uuid.UUID:
    # SQLite hands UUID columns back as hex text.
    return value if isinstance(value, uuid.UUID) else uuid.UUID(value)


# --- before the guard ----------------------------------------------------------------------

_CONTRACT_SCHEMA = "SELECT json_schema FROM {contract} WHERE name = %s"


def contract_schema(tool: str) -> Any:
    """The named tool contract's JSON Schema, or None if there is no such contract."""
    with connection.cursor() as cursor:
        cursor.execute(_sql(_CONTRACT_SCHEMA), (tool,))
        row = cursor.fetchone()
    # Both backends hand JSON columns back as text; JSONField decodes it the same way.
    return None if row is None else json.loads(row[0])


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
 RETURNING id, occurrence_id, fingerprint,
           (SELECT COUNT(*) FROM {epoch} WHERE {epoch}.occurrence_id = {approval}.occurrence_id)
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
    )
    with connection.cursor() as cursor:
        cursor.execute(_sql(_CONSUME), params)
        row = cursor.fetchone()
    if row is None:
        return None
    approval_id, occurrence_id, fingerprint, epochs = row
    return Consumed(approval_id, _uuid(occurrence_id), fingerprint, epochs)


# --- after the guard: the rest of an admitted claim ---------------------------------------

_MARK_CLAIMED = """
    UPDATE {occurrence} SET status = %s, updated_at = {now} WHERE id = %s AND status = %s
"""


def occurrence_mark_claimed(occurrence_id: uuid.UUID) -> None:
    """An approved occurrence becomes claimed (one in another state stays as it is)."""
    params = (
        Occurrence.Status.CLAIMED.value,
        Occurrence._meta.pk.get_db_prep_value(occurrence_id, connection),  # type: ignore[union-attr]
        Occurrence.Status.APPROVED.value,
    )
    with connection.cursor() as cursor:
        cursor.execute(_sql(_MARK_CLAIMED), params)


def insert_row(model: type[M], **values: Any) -> M:
    """INSERT one row and return it as a saved instance, like ``Model.objects.create()``.

    Every column must be given (an auto-increment primary key excepted, which is returned):
    model defaults, ``auto_now_add`` and signals do not apply here, and a missing column is
    an error rather than a silent NULL or database default.
    """
    plan = _insert_plan(model, tuple(values), connection.vendor)
    params = [
        field.get_db_prep_save(value, connection)
        for field, value in zip(plan.fields, values.values(), strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(plan.sql, params)
        if plan.returned_pk:
            values[plan.returned_pk] = cursor.fetchone()[0]
    instance = model(**values)
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance


class _InsertPlan(NamedTuple):
    sql: str
    fields: list[models.Field[Any, Any]]
    returned_pk: str | None  # the attname of an auto-increment key the INSERT returns


@functools.cache
def _insert_plan(model: type[models.Model], names: tuple[str, ...], vendor: str) -> _InsertPlan:
    by_attname = {f.attname: f for f in model._meta.concrete_fields}
    pk = model._meta.pk
    returned_pk = None
    if isinstance(pk, models.AutoField | models.BigAutoField) and pk.attname not in names:
        returned_pk = pk.attname
    expected = set(by_attname) - {returned_pk}
    if set(names) != expected:
        missing = ", ".join(sorted(expected - set(names))) or "-"
        unknown = ", ".join(sorted(set(names) - expected)) or "-"
        raise TypeError(f"insert_row({model.__name__}): missing {missing}; unknown {unknown}")
    quote = connection.ops.quote_name
    fields = [by_attname[name] for name in names]
    columns = ", ".join(quote(cast(str, f.column)) for f in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES ({placeholders})"  # noqa: S608
    if returned_pk:
        sql += f" RETURNING {quote(cast(str, by_attname[returned_pk].column))}"
    return _InsertPlan(sql, fields, returned_pk)


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
    superseded: bool
    expired: bool  # expires_at has passed by the same clock the guard used


_FIND = """
    SELECT id, occurrence_id, token_hash, fingerprint, state, tool_name, action_digest,
           consumed_by_execution, superseded_at IS NOT NULL, expires_at <= {now}
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
    (pk, occurrence_id, found_hash, fingerprint, state, tool, digest, execution, sup, exp) = row
    return FoundApproval(
        pk,
        _uuid(occurrence_id),
        found_hash,
        fingerprint,
        state,
        tool,
        digest,
        execution,
        bool(sup),  # SQLite answers 0 or 1
        bool(exp),
    )
