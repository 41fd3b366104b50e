"""The investigation's reads: the seeds a query names, the chain of events around them
(newest and decisive first), approvals, commands, invocations, operator decisions and
duplicate deliveries."""

from __future__ import annotations

from typing import Any

from django.db import connection, models
from django.db.models import (
    Case,
    CharField,
    F,
    Field,
    Func,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    UUIDField,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce

from approvals import vocabulary
from approvals.compiled import (
    Compiled,
    CompiledStatement,
    Literal,
    Param,
    ParamArray,
    ParamList,
)
from approvals.models import (
    Approval,
    AuditDuplicateDelivery,
    AuditEvent,
    AuditIngestion,
    Command,
    Occurrence,
    Proposal,
    Tenant,
)
from approvals.vocabulary import AuditKind, ClaimDecision
from reconciliation.investigations.access import User
from reconciliation.investigations.facts import (
    EventFact,
)
from reconciliation.models import AdapterInvocation, OperatorDecision

# The approval's columns ``ApprovalFact`` is built from.
_APPROVAL_FIELDS = (
    "tenant_id",
    "occurrence_id",
    "fingerprint",
    "state",
    "expires_at",
    "consumed_by_execution",
    "issued_at",
    "delivered_at",
)


# The chain's newest events, by id but not along an index in id order: PostgreSQL would
# walk the primary key (or the tenant's (tenant, id) index) back from the newest event,
# filtering, until it had found EVENT_LIMIT of the chain's. For a chain of thousands of
# events a month old that is every event written since (300,000 newer events: 113 ms,
# where finding the chain's events through their own indexes and sorting them takes 2-4
# ms, however old they are). ``_newest_rows`` reads along an index only where the index
# holds nothing but the chain's events, in id order.
_NEWEST_FIRST = (F("id") + 0).desc()


_OLDEST_FIRST = (F("id") + 0).asc()  # the decisive events, for the same reason


# What ``EventFact`` holds, in the order ``_event_fact_of_row`` reads it.
_EVENT_COLUMNS = (
    "pk",
    "event_id",
    "kind",
    "tenant_id",
    "source_time",
    "token_fingerprint",
    "decision",
    "reason_code",
    "execution_id",
    "message_id",
    "command_id",
    "occurrence_id",
    "receipt_value",  # the payload's "receipt", decoded, or None
    "ingestion_id",
    "ingested_at",
)


def _event_fact_of_row(row: tuple[Any, ...], texts: dict[Any, str]) -> EventFact:
    """An event read by ``_EVENT_COLUMNS`` (elsewhere than on PostgreSQL). ``texts``
    keeps the text of each UUID seen: a chain's events name the same few occurrences and
    commands hundreds of times."""
    (
        pk,
        event_id,
        kind,
        tenant_id,
        source_time,
        fingerprint,
        decision,
        reason_code,
        execution_id,
        message_id,
        command_id,
        occurrence_id,
        receipt,
        ingestion_id,
        ingested_at,
    ) = row
    return EventFact(
        pk,
        str(event_id),
        kind,
        tenant_id,
        source_time,
        fingerprint,
        decision,
        reason_code,
        execution_id,
        message_id,
        ""
        if command_id is None
        else texts.get(command_id) or texts.setdefault(command_id, str(command_id)),
        ""
        if occurrence_id is None
        else texts.get(occurrence_id) or texts.setdefault(occurrence_id, str(occurrence_id)),
        # Only an effect event's receipt names an effect.
        receipt if isinstance(receipt, str) and kind.startswith(vocabulary.EFFECT_PREFIX) else "",
        ingestion_id,
        ingested_at,
    )


_UUID: Field[Any, Any] = UUIDField()


_TEXT: Field[Any, Any] = CharField()


_TENANT = Tenant._meta.pk


def _tenants(size: int) -> ParamList:
    return ParamList("tenant_ids", size, _TENANT)


def _in(lookup: str, name: str, size: int, field: Any) -> Q:
    """``lookup__in`` the list ``name``; nothing for an empty one."""
    if not size:
        return Q(pk__in=[])
    return Q(**{f"{lookup}__in": ParamList(name, size, field)})


# The fingerprint's and the execution's indexes hold only events that have one; the
# conditions that say so are written into the statements (compiled.Literal), so that
# PostgreSQL can use those indexes in a prepared statement's generic plan. (Never an empty
# value is looked up: ``q`` is not empty, nor is any fingerprint gathered.)
_HAS_FINGERPRINT = ~Q(token_fingerprint=Literal(""))


_HAS_EXECUTION = ~Q(execution_id=Literal(""))


# DECISIVE_EVENTS, the audit_decisive_* indexes' condition, in the statements' text.
_DECISIVE_EVENTS = Q(decision=Literal(ClaimDecision.APPROVED)) | Q(
    kind=Literal(AuditKind.EFFECT_COMMITTED)
)


def _fingerprint_is(value: Any) -> Q:
    return Q(token_fingerprint=value) & _HAS_FINGERPRINT


def _named(by_id: bool) -> Q:
    """What the id names (``named`` in ``_investigation_get``), as parameters."""
    named = _fingerprint_is(Param("q", _TEXT)) | (
        Q(execution_id=Param("q", _TEXT)) & _HAS_EXECUTION
    )
    if by_id:
        named |= Q(occurrence_id=Param("pk", _UUID)) | Q(
            command_id=Param("pk", _UUID), ingestion__isnull=False
        )
    return named


def _chain_arms(
    by_id: bool, occurrence_ids: int, fingerprints: int, command_ids: int
) -> list[tuple[Q, bool]]:
    """The ways the chain names an event, each with whether an index holds that arm's
    events in id order (one value of an indexed column: the fingerprint's, execution's and
    occurrence's, and the ingested events' command index, end with the id)."""
    arms = [
        (_fingerprint_is(Param("q", _TEXT)), True),
        (Q(execution_id=Param("q", _TEXT)) & _HAS_EXECUTION, True),
    ]
    if by_id:
        arms += [
            (Q(occurrence_id=Param("pk", _UUID)), True),
            (Q(command_id=Param("pk", _UUID), ingestion__isnull=False), True),
        ]
    if occurrence_ids:
        arms.append(
            (_in("occurrence_id", "occurrence_ids", occurrence_ids, _UUID), occurrence_ids == 1)
        )
    if fingerprints:
        arms.append(
            (
                _in("token_fingerprint", "fingerprints", fingerprints, _TEXT) & _HAS_FINGERPRINT,
                fingerprints == 1,
            )
        )
    if command_ids:
        arms.append(
            (
                _in("command_id", "command_ids", command_ids, _UUID) & Q(ingestion__isnull=False),
                command_ids == 1,
            )
        )
    return arms


def _chain_q(by_id: bool, occurrence_ids: int, fingerprints: int, command_ids: int) -> Q:
    chain = Q()
    for arm, _ in _chain_arms(by_id, occurrence_ids, fingerprints, command_ids):
        chain |= arm
    return chain


def _event_rows(tenant_ids: int, condition: Q) -> QuerySet[AuditEvent, tuple[Any, ...]]:
    rows = AuditEvent.objects.filter(tenant_id__in=_tenants(tenant_ids)).filter(condition)
    if connection.vendor == "postgresql":
        # Each row as ``EventFact`` holds it, made by PostgreSQL: the ids as its text of
        # them (which is str(uuid)), "" for none, and an effect's receipt if it is a
        # string. Hundreds of UUIDs loaded and turned back into text, and a JSON value
        # decoded per row, cost more than the rest of the rows.
        rows = rows.annotate(
            receipt_type=Func(F("data__receipt"), function="jsonb_typeof", output_field=_TEXT)
        )
        return rows.annotate(
            event_text=Cast("event_id", TextField()),
            command_text=Coalesce(
                Cast("command_id", TextField()), Value(""), output_field=TextField()
            ),
            occurrence_text=Coalesce(
                Cast("occurrence_id", TextField()), Value(""), output_field=TextField()
            ),
            receipt_text=Case(
                When(
                    kind__startswith=vocabulary.EFFECT_PREFIX,
                    receipt_type="string",
                    then=KT("data__receipt"),
                ),
                default=Value(""),
                output_field=TextField(),
            ),
        ).values_list(*_EVENT_FACT_COLUMNS)
    return rows.annotate(receipt_value=F("data__receipt")).values_list(*_EVENT_COLUMNS)


# On PostgreSQL, ``EventFact``'s fields in its order: each row is one (``EventFact._make``).
_EVENT_FACT_COLUMNS = tuple(
    {
        "event_id": "event_text",
        "command_id": "command_text",
        "occurrence_id": "occurrence_text",
        "receipt_value": "receipt_text",
    }.get(c, c)
    for c in _EVENT_COLUMNS
)


def _chain_rows(
    by_id: bool, tenant_ids: int, occurrence_ids: int, fingerprints: int, command_ids: int
) -> QuerySet[AuditEvent, tuple[Any, ...]]:
    return _event_rows(tenant_ids, _chain_q(by_id, occurrence_ids, fingerprints, command_ids))


def _newest_rows(
    limit: int,
    by_id: bool,
    tenant_ids: int,
    occurrence_ids: int,
    fingerprints: int,
    command_ids: int,
) -> QuerySet[AuditEvent, tuple[Any, ...]]:
    """The chain's newest ``limit`` events, the chain sorted whole (SQLite; PostgreSQL
    reads them by ``_newest_statement``)."""
    return _chain_rows(by_id, tenant_ids, occurrence_ids, fingerprints, command_ids).order_by(
        _NEWEST_FIRST
    )[:limit]


def _newest_statement(
    limit: int,
    by_id: bool,
    tenant_ids: int,
    occurrence_ids: int,
    fingerprints: int,
    command_ids: int,
) -> tuple[str, list[Any]]:
    """The chain's newest ``limit`` events on PostgreSQL: each arm's newest ``limit`` first,
    then the newest of those. An arm that an index holds in id order (for one tenant) is
    read backwards along it, ``limit`` rows at most however long the chain, and any other
    arm is found through its index and sorted (``_NEWEST_FIRST``), never by walking the
    table's ids. The arms, each in id order, are merged and the first row of each id kept
    (``DISTINCT ON``): a UNION would hash every row read whole to drop the arms' overlap."""
    sqls: list[str] = []
    params: list[Any] = []
    for arm, ordered in _chain_arms(by_id, occurrence_ids, fingerprints, command_ids):
        part = _event_rows(tenant_ids, arm).order_by(
            "-id" if ordered and tenant_ids == 1 else _NEWEST_FIRST
        )[:limit]
        sql, part_params = part.query.sql_with_params()
        sqls.append(f"({sql})")
        params.extend(part_params)
    # The first column is the event's id (_EVENT_COLUMNS); ``limit`` is an int.
    chain = " UNION ALL ".join(sqls)
    return (
        f"SELECT DISTINCT ON (1) * FROM ({chain}) AS chain ORDER BY 1 DESC LIMIT {int(limit)}",  # noqa: S608
        params,
    )


_SEEDS = {
    by_id: Compiled[tuple[str, Any, Any]](
        lambda tenant_ids, by_id=by_id: (
            AuditEvent.objects.filter(tenant_id__in=_tenants(tenant_ids))
            .filter(_named(by_id))
            .order_by()
            .values_list("token_fingerprint", "occurrence_id", "command_id")
            .distinct()[:SEED_LIMIT]
        )
    )
    for by_id in (False, True)
}


_SEED_APPROVALS = {
    by_id: Compiled[tuple[Any, str]](
        lambda tenant_ids, by_id=by_id: (
            Approval.objects.filter(tenant_id__in=_tenants(tenant_ids))
            .filter(
                Q(fingerprint=Param("q", _TEXT))
                | (Q(occurrence_id=Param("pk", _UUID)) if by_id else Q())
            )
            .order_by()
            .values_list("occurrence_id", "fingerprint")[:SEED_LIMIT]
        )
    )
    for by_id in (False, True)
}


_SEED_COMMANDS = Compiled[tuple[Any, Any]](
    lambda tenant_ids: (
        Command.objects.filter(tenant_id__in=_tenants(tenant_ids))
        .filter(Q(pk=Param("pk", _UUID)) | Q(occurrence_id=Param("pk", _UUID)))
        .order_by()
        .values_list("pk", "occurrence_id")[:SEED_LIMIT]
    )
)


_APPROVALS = Compiled[Approval](
    lambda tenant_ids, occurrence_ids, fingerprints: (
        Approval.objects.filter(tenant_id__in=_tenants(tenant_ids))
        .filter(
            _in("occurrence_id", "occurrence_ids", occurrence_ids, _UUID)
            | _in("fingerprint", "fingerprints", fingerprints, _TEXT)
        )
        .select_related("approver")
        # What ``ApprovalFact`` holds: the token's hash and the approver's password hash
        # stay in the database (fewer columns to compile, read and build).
        .only(*_APPROVAL_FIELDS, f"approver__{User.USERNAME_FIELD}")
        .order_by("issued_at", "pk")[:SEED_LIMIT]
    )
)


_OCCURRENCES = Compiled[Occurrence](
    lambda tenant_ids, occurrence_ids: (
        Occurrence.objects.filter(tenant_id__in=_tenants(tenant_ids))
        .filter(_in("pk", "occurrence_ids", occurrence_ids, _UUID))
        .select_related("tool", "tenant")
        # What the page shows of each: its tool's and tenant's names, its status and the
        # amounts of its current action, read in the same statement.
        .only("tenant_id", "tool_id", "status", "created_at", "tool__name", "tenant__name")
        .annotate(
            current_action=Subquery(
                Proposal.objects.filter(occurrence=OuterRef("pk"), is_current=True).values(
                    "canonical_action"
                )[:1]
            )
        )
        .order_by("created_at")
    )
)


_COMMANDS = Compiled[Command](
    lambda tenant_ids, occurrence_ids, command_ids: (
        Command.objects.filter(tenant_id__in=_tenants(tenant_ids))
        .filter(
            _in("occurrence_id", "occurrence_ids", occurrence_ids, _UUID)
            | _in("pk", "command_ids", command_ids, _UUID)
        )
        .order_by("created_at")[:SEED_LIMIT]
    )
)


_INVOCATIONS = Compiled[AdapterInvocation](
    lambda command_ids: (
        AdapterInvocation.objects.filter(_in("command_id", "command_ids", command_ids, _UUID))
        .select_related("epoch")
        .order_by("command_id", "number")
    )
)


_DECISIONS = Compiled[OperatorDecision](
    lambda command_ids: OperatorDecision.objects.filter(
        _in("command_id", "command_ids", command_ids, _UUID)
    ).order_by("created_at", "pk")
)


_NEWEST = {
    by_id: Compiled[tuple[Any, ...]](
        lambda limit, tenant_ids, occurrence_ids, fingerprints, command_ids, by_id=by_id: (
            _newest_rows(limit, by_id, tenant_ids, occurrence_ids, fingerprints, command_ids)
        )
    )
    for by_id in (False, True)
}


_NEWEST_STATEMENT = {
    by_id: CompiledStatement(
        lambda limit, tenant_ids, occurrence_ids, fingerprints, command_ids, by_id=by_id: (
            _newest_statement(limit, by_id, tenant_ids, occurrence_ids, fingerprints, command_ids)
        )
    )
    for by_id in (False, True)
}


def _newest(by_id: bool, chain_values: dict[str, Any]) -> list[tuple[Any, ...]]:
    if connection.vendor == "postgresql":
        return _NEWEST_STATEMENT[by_id].rows(fixed={"limit": EVENT_LIMIT}, **chain_values)
    return _NEWEST[by_id].run(fixed={"limit": EVENT_LIMIT}, **chain_values)


_DECISIVE = {
    by_id: Compiled[tuple[Any, ...]](
        lambda limit, tenant_ids, occurrence_ids, fingerprints, command_ids, by_id=by_id: (
            _chain_rows(by_id, tenant_ids, occurrence_ids, fingerprints, command_ids)
            .filter(_DECISIVE_EVENTS)
            .order_by(_OLDEST_FIRST)[:limit]
        )
    )
    for by_id in (False, True)
}


# How many events the chain holds, by tenant (one row per tenant, summed).
_COUNT = {
    by_id: Compiled[int](
        lambda tenant_ids, occurrence_ids, fingerprints, command_ids, by_id=by_id: (
            AuditEvent.objects.filter(tenant_id__in=_tenants(tenant_ids))
            .filter(_chain_q(by_id, occurrence_ids, fingerprints, command_ids))
            .order_by()
            .values("tenant_id")
            .annotate(n=models.Count("*"))
            .values_list("n", flat=True)
        )
    )
    for by_id in (False, True)
}


# The later deliveries of the events read, named by their ids in one parameter.
_DELIVERIES = Compiled[AuditDuplicateDelivery](
    lambda tenant_ids: (
        AuditDuplicateDelivery.objects.filter(
            tenant_id__in=_tenants(tenant_ids), original_id__in=ParamArray("read")
        )
        .select_related("ingestion")
        .order_by("id")
    )
)


# Who sent the batches the events read came in: the producers a conflict names.
_PRODUCERS = Compiled[tuple[int, str | None]](
    lambda: (
        AuditIngestion.objects.filter(pk__in=ParamArray("ingestions"))
        .order_by()
        .values_list("pk", "runtime_key__name")
    )
)


# Bounds that keep one page's work bounded when an id names very many things.
SEED_LIMIT = 200


OCCURRENCE_LIMIT = 50


EVENT_LIMIT = 500


DECISIVE_LIMIT = 200
