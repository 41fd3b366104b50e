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

from approvals.models import Approval, Epoch

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
