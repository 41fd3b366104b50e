"""The investigation's reads: the seeds a query names, the chain of events around them
(newest and decisive first), approvals, commands, invocations, operator decisions and
duplicate deliveries.

On PostgreSQL each is one plain SQL statement (``approvals.sql``); SQLite runs its ORM twin
(``reconciliation.investigations.reads_orm``), which the tests hold it equal to. A chain
is read as plain values (``EventFact``), never as models: a chain of hundreds of events is
read on every request, and building (and decoding the payload of) each model cost more
than the query.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model

from approvals import vocabulary
from approvals.models import (
    Approval,
    AuditDuplicateDelivery,
    AuditIngestion,
    Command,
    Epoch,
    Occurrence,
    Tenant,
    ToolContract,
)
from approvals.sql import Columns, fetch, on_postgresql, split
from approvals.vocabulary import AuditKind, ClaimDecision
from reconciliation.investigations import reads_orm
from reconciliation.investigations.reads_orm import Chain
from reconciliation.models import AdapterInvocation, OperatorDecision

# Bounds that keep one page's work bounded when an id names very many things.
SEED_LIMIT = 200
OCCURRENCE_LIMIT = 50
EVENT_LIMIT = 500
DECISIVE_LIMIT = 200


def _equals(column: str, values: list[Any] | int) -> str:
    """``column`` is one of the values given (``%s`` stands for them): ``= %s`` for one
    value, which PostgreSQL can read along an index in order, ``= ANY(%s)`` for a list."""
    return f"{column} = %s" if values == 1 else f"{column} = ANY(%s)"


def _one_or_all(values: list[Any]) -> Any:
    """The parameter ``_equals`` wrote ``%s`` for."""
    return values[0] if len(values) == 1 else values


# What the fingerprint's and the execution's indexes hold (their conditions, written as the
# indexes' are, so that PostgreSQL uses them in a prepared statement's generic plan).
_HAS_FINGERPRINT = "NOT (e.token_fingerprint = '')"
_HAS_EXECUTION = "NOT (e.execution_id = '')"
# DECISIVE_EVENTS, the audit_decisive_* indexes' condition.
_DECISIVE = f"(e.decision = '{ClaimDecision.APPROVED}' OR e.kind = '{AuditKind.EFFECT_COMMITTED}')"


# --- what the id names ------------------------------------------------------------------


def seeds(*, q: str, pk: uuid.UUID | None, tenant_ids: list[int]) -> list[tuple[Any, ...]]:
    """(fingerprint, occurrence id, command id) of the events ``q`` names."""
    if not on_postgresql():
        return reads_orm.seeds(q=q, pk=pk, tenant_ids=tenant_ids, limit=SEED_LIMIT)
    named = (
        f"(e.token_fingerprint = %s AND {_HAS_FINGERPRINT})"
        f" OR (e.execution_id = %s AND {_HAS_EXECUTION})"
    )
    params: list[Any] = [_one_or_all(tenant_ids), q, q]
    if pk is not None:
        named += " OR e.occurrence_id = %s OR (e.command_id = %s AND e.ingestion_id IS NOT NULL)"
        params += [pk, pk]
    sql = f"""SELECT DISTINCT e.token_fingerprint, e.occurrence_id, e.command_id
                FROM approvals_auditevent e
               WHERE {_equals("e.tenant_id", len(tenant_ids))} AND ({named})
               LIMIT {SEED_LIMIT}"""  # noqa: S608 (no input in the text)
    return fetch(sql, params)


def seed_approvals(*, q: str, pk: uuid.UUID | None, tenant_ids: list[int]) -> list[tuple[Any, ...]]:
    """(occurrence id, fingerprint) of the approvals ``q`` names."""
    if not on_postgresql():
        return reads_orm.seed_approvals(q=q, pk=pk, tenant_ids=tenant_ids, limit=SEED_LIMIT)
    named, params = "a.fingerprint = %s", [_one_or_all(tenant_ids), q]
    if pk is not None:
        named, params = named + " OR a.occurrence_id = %s", [*params, pk]
    sql = f"""SELECT a.occurrence_id, a.fingerprint FROM approvals_approval a
               WHERE {_equals("a.tenant_id", len(tenant_ids))} AND ({named})
               LIMIT {SEED_LIMIT}"""  # noqa: S608
    return fetch(sql, params)


def seed_commands(*, pk: uuid.UUID, tenant_ids: list[int]) -> list[tuple[Any, ...]]:
    """(command id, occurrence id) of the commands the id names (its own, or its
    occurrence's)."""
    if not on_postgresql():
        return reads_orm.seed_commands(pk=pk, tenant_ids=tenant_ids, limit=SEED_LIMIT)
    sql = f"""SELECT c.id, c.occurrence_id FROM approvals_command c
               WHERE {_equals("c.tenant_id", len(tenant_ids))}
                 AND (c.id = %s OR c.occurrence_id = %s)
               LIMIT {SEED_LIMIT}"""  # noqa: S608
    return fetch(sql, [_one_or_all(tenant_ids), pk, pk])


# --- the records around it --------------------------------------------------------------


def _all_but(model: Any, *kept: str) -> list[str]:
    return [f.name for f in model._meta.concrete_fields if f.name not in kept]


# What ``ApprovalFact`` holds: the token's hash and the approver's password hash stay in
# the database (fewer columns to read and build).
_APPROVAL = Columns(
    Approval,
    "a",
    defer=[
        f.name for f in Approval._meta.concrete_fields if f.attname not in reads_orm.APPROVAL_FIELDS
    ],
)
_USER_MODEL = get_user_model()
_APPROVER = Columns(_USER_MODEL, "u", defer=_all_but(_USER_MODEL, _USER_MODEL.USERNAME_FIELD))


def approvals(
    *, tenant_ids: list[int], occurrence_ids: list[Any], fingerprints: list[str]
) -> list[Approval]:
    """The approvals of those occurrences and fingerprints, each with its approver's name."""
    if not on_postgresql():
        return reads_orm.approvals(
            tenant_ids=tenant_ids,
            occurrence_ids=occurrence_ids,
            fingerprints=fingerprints,
            limit=SEED_LIMIT,
        )
    if not occurrence_ids and not fingerprints:
        return []
    sql = f"""SELECT {_APPROVAL.sql}, {_APPROVER.sql}
                FROM approvals_approval a JOIN auth_user u ON u.id = a.approver_id
               WHERE {_equals("a.tenant_id", len(tenant_ids))}
                 AND (a.occurrence_id = ANY(%s) OR a.fingerprint = ANY(%s))
               ORDER BY a.issued_at, a.id
               LIMIT {SEED_LIMIT}"""  # noqa: S608
    found = []
    for row in fetch(sql, [_one_or_all(tenant_ids), occurrence_ids, fingerprints]):
        approval, approval.approver = split(row, _APPROVAL, _APPROVER)
        found.append(approval)
    return found


# What the page shows of an occurrence: its tool's and tenant's names, its status and the
# amounts of its current action (read in the same statement).
_OCCURRENCE = Columns(Occurrence, "o", defer=_all_but(Occurrence, *reads_orm.OCCURRENCE_FIELDS))
_TOOL = Columns(ToolContract, "t", defer=_all_but(ToolContract, "name"))
_TENANT = Columns(Tenant, "n", defer=_all_but(Tenant, "name"))


def occurrences(*, tenant_ids: list[int], occurrence_ids: list[Any]) -> list[Occurrence]:
    """The occurrences, oldest first, each with its tool and tenant (their names) and its
    current action (``current_action``)."""
    if not on_postgresql():
        return reads_orm.occurrences(tenant_ids=tenant_ids, occurrence_ids=occurrence_ids)
    if not occurrence_ids:
        return []
    sql = f"""SELECT {_OCCURRENCE.sql}, {_TOOL.sql}, {_TENANT.sql},
                     (SELECT p.canonical_action FROM approvals_proposal p
                       WHERE p.occurrence_id = o.id AND p.is_current LIMIT 1)
                FROM approvals_occurrence o
                JOIN approvals_toolcontract t ON t.id = o.tool_id
                JOIN approvals_tenant n ON n.id = o.tenant_id
               WHERE {_equals("o.tenant_id", len(tenant_ids))} AND o.id = ANY(%s)
               ORDER BY o.created_at"""  # noqa: S608
    found = []
    for row in fetch(sql, [_one_or_all(tenant_ids), occurrence_ids]):
        occurrence, occurrence.tool, occurrence.tenant, action = split(
            row, _OCCURRENCE, _TOOL, _TENANT, 1
        )
        occurrence.current_action = action
        found.append(occurrence)
    return found


_COMMAND = Columns(Command, "c")


def commands(
    *, tenant_ids: list[int], occurrence_ids: list[Any], command_ids: list[Any]
) -> list[Command]:
    if not on_postgresql():
        return reads_orm.commands(
            tenant_ids=tenant_ids,
            occurrence_ids=occurrence_ids,
            command_ids=command_ids,
            limit=SEED_LIMIT,
        )
    if not occurrence_ids and not command_ids:
        return []
    sql = f"""SELECT {_COMMAND.sql} FROM approvals_command c
               WHERE {_equals("c.tenant_id", len(tenant_ids))}
                 AND (c.occurrence_id = ANY(%s) OR c.id = ANY(%s))
               ORDER BY c.created_at
               LIMIT {SEED_LIMIT}"""  # noqa: S608
    params = [_one_or_all(tenant_ids), occurrence_ids, command_ids]
    return [_COMMAND.load(row) for row in fetch(sql, params)]


_INVOCATION = Columns(AdapterInvocation, "i")
_EPOCH = Columns(Epoch, "p")
_DECISION = Columns(OperatorDecision, "d")


def invocations(*, command_ids: list[Any]) -> list[AdapterInvocation]:
    """The commands' adapter invocations, each with its epoch."""
    if not on_postgresql():
        return reads_orm.invocations(command_ids=command_ids)
    if not command_ids:
        return []
    sql = f"""SELECT {_INVOCATION.sql}, {_EPOCH.sql}
                FROM reconciliation_adapterinvocation i
                JOIN approvals_epoch p ON p.id = i.epoch_id
               WHERE i.command_id = ANY(%s)
               ORDER BY i.command_id, i.number"""  # noqa: S608
    found = []
    for row in fetch(sql, [command_ids]):
        invocation, invocation.epoch = split(row, _INVOCATION, _EPOCH)
        found.append(invocation)
    return found


def decisions(*, command_ids: list[Any]) -> list[OperatorDecision]:
    if not on_postgresql():
        return reads_orm.decisions(command_ids=command_ids)
    if not command_ids:
        return []
    sql = f"""SELECT {_DECISION.sql} FROM reconciliation_operatordecision d
               WHERE d.command_id = ANY(%s)
               ORDER BY d.created_at, d.id"""  # noqa: S608
    return [_DECISION.load(row) for row in fetch(sql, [command_ids])]


# --- the chain of events ----------------------------------------------------------------

# ``EventFact``'s fields, in its order, made by PostgreSQL: the ids as its text of them
# (which is str(uuid)), "" for none, and an effect's receipt if it is a string. Hundreds of
# UUIDs loaded and turned back into text, and a JSON value decoded per row, cost more than
# the rest of the rows.
_EVENT_FACT_SQL = f"""e.id, e.event_id::text, e.kind, e.tenant_id, e.source_time,
       e.token_fingerprint, e.decision, e.reason_code, e.execution_id, e.message_id,
       COALESCE(e.command_id::text, ''), COALESCE(e.occurrence_id::text, ''),
       CASE WHEN e.kind LIKE '{vocabulary.EFFECT_PREFIX}%%'
             AND jsonb_typeof(e.data -> 'receipt') = 'string'
            THEN e.data ->> 'receipt' ELSE '' END,
       e.ingestion_id, e.ingested_at"""


def _arms(chain: Chain) -> list[tuple[str, list[Any], bool]]:
    """The ways the chain names an event: each arm's condition, its values, and whether an
    index holds that arm's events in id order (one value of an indexed column: the
    fingerprint's, execution's and occurrence's, and the ingested events' command index,
    end with the id)."""
    arms: list[tuple[str, list[Any], bool]] = [
        (f"e.token_fingerprint = %s AND {_HAS_FINGERPRINT}", [chain.q], True),
        (f"e.execution_id = %s AND {_HAS_EXECUTION}", [chain.q], True),
    ]
    if chain.pk is not None:
        arms += [
            ("e.occurrence_id = %s", [chain.pk], True),
            ("e.command_id = %s AND e.ingestion_id IS NOT NULL", [chain.pk], True),
        ]
    if chain.occurrence_ids:
        one = len(chain.occurrence_ids) == 1
        arms.append(
            (
                _equals("e.occurrence_id", len(chain.occurrence_ids)),
                [_one_or_all(chain.occurrence_ids)],
                one,
            )
        )
    if chain.fingerprints:
        one = len(chain.fingerprints) == 1
        arms.append(
            (
                f"{_equals('e.token_fingerprint', len(chain.fingerprints))} AND {_HAS_FINGERPRINT}",
                [_one_or_all(chain.fingerprints)],
                one,
            )
        )
    if chain.command_ids:
        one = len(chain.command_ids) == 1
        arms.append(
            (
                f"{_equals('e.command_id', len(chain.command_ids))} AND e.ingestion_id IS NOT NULL",
                [_one_or_all(chain.command_ids)],
                one,
            )
        )
    return arms


def _chain_where(chain: Chain) -> tuple[str, list[Any]]:
    """The chain as one condition (its arms OR-ed), with the tenant's, and its values."""
    arms = _arms(chain)
    condition = " OR ".join(f"({sql})" for sql, _, _ in arms)
    params = [_one_or_all(chain.tenant_ids)] + [p for _, values, _ in arms for p in values]
    return f"{_equals('e.tenant_id', len(chain.tenant_ids))} AND ({condition})", params


def newest(chain: Chain) -> list[tuple[Any, ...]]:
    """The chain's newest ``EVENT_LIMIT`` events, newest first.

    Each arm's newest first, then the newest of those. An arm that an index holds in id
    order (for one tenant) is read backwards along it, ``EVENT_LIMIT`` rows at most however
    long the chain, and any other arm is found through its index and sorted by ``id + 0``
    (an expression no index holds), never by walking the table's ids: PostgreSQL would walk
    the primary key, or the tenant's (tenant, id) index, back from the newest event,
    filtering, until it had found enough of the chain's (for an old chain, every event
    written since). The arms, each in id order, are merged and the first row of each id kept
    (``DISTINCT ON``): a UNION would hash every row read whole to drop the arms' overlap."""
    if not on_postgresql():
        return reads_orm.newest(chain, EVENT_LIMIT)
    tenants = _equals("e.tenant_id", len(chain.tenant_ids))
    parts, params = [], []
    for condition, values, ordered in _arms(chain):
        order = "e.id" if ordered and len(chain.tenant_ids) == 1 else "e.id + 0"
        parts.append(
            f"""(SELECT {_EVENT_FACT_SQL} FROM approvals_auditevent e
                  WHERE {tenants} AND {condition}
                  ORDER BY {order} DESC LIMIT {EVENT_LIMIT})"""  # noqa: S608
        )
        params += [_one_or_all(chain.tenant_ids), *values]
    sql = f"""SELECT DISTINCT ON (1) * FROM ({" UNION ALL ".join(parts)}) AS chain
               ORDER BY 1 DESC LIMIT {EVENT_LIMIT}"""  # noqa: S608
    return fetch(sql, params)


def decisive(chain: Chain) -> list[tuple[Any, ...]]:
    """The chain's oldest ``DECISIVE_LIMIT`` approved decisions and committed effects,
    found by the audit_decisive_* indexes however many refusals surround them."""
    if not on_postgresql():
        return reads_orm.decisive(chain, DECISIVE_LIMIT)
    where, params = _chain_where(chain)
    sql = f"""SELECT {_EVENT_FACT_SQL} FROM approvals_auditevent e
               WHERE {where} AND {_DECISIVE}
               ORDER BY e.id + 0
               LIMIT {DECISIVE_LIMIT}"""  # noqa: S608
    return fetch(sql, params)


def count(chain: Chain) -> int:
    """How many events the chain holds."""
    if not on_postgresql():
        return reads_orm.count(chain)
    where, params = _chain_where(chain)
    sql = f"SELECT COUNT(*) FROM approvals_auditevent e WHERE {where}"  # noqa: S608
    return int(fetch(sql, params)[0][0])


def producers(*, ingestion_ids: list[int]) -> dict[int, str]:
    """Who sent the batches the events read came in (the runtime key's name, "" for a key
    gone): the producers a conflict names."""
    if not ingestion_ids:
        return {}
    if not on_postgresql():
        return reads_orm.producers(ingestion_ids=ingestion_ids)
    sql = """SELECT g.id, k.name FROM approvals_auditingestion g
               LEFT JOIN approvals_runtimekey k ON k.id = g.runtime_key_id
              WHERE g.id = ANY(%s)"""
    return {batch: name or "" for batch, name in fetch(sql, [ingestion_ids])}


_DELIVERY = Columns(AuditDuplicateDelivery, "d")
_INGESTION = Columns(AuditIngestion, "g")


def deliveries(*, tenant_ids: list[int], event_ids: list[int]) -> list[AuditDuplicateDelivery]:
    """The later deliveries of the events read, each with its ingestion."""
    if not on_postgresql():
        return reads_orm.deliveries(tenant_ids=tenant_ids, event_ids=event_ids)
    if not event_ids:
        return []
    sql = f"""SELECT {_DELIVERY.sql}, {_INGESTION.sql}
                FROM approvals_auditduplicatedelivery d
                JOIN approvals_auditingestion g ON g.id = d.ingestion_id
               WHERE {_equals("d.tenant_id", len(tenant_ids))} AND d.original_id = ANY(%s)
               ORDER BY d.id"""  # noqa: S608
    found = []
    for row in fetch(sql, [_one_or_all(tenant_ids), event_ids]):
        delivery, delivery.ingestion = split(row, _DELIVERY, _INGESTION)
        found.append(delivery)
    return found
