"""Reads of occurrences and their approvals: by id within a tenant, by run and
``client_ref``, with what the API shows of them, and the approval's effective state."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    Prefetch,
    Q,
    QuerySet,
    prefetch_related_objects,
)
from django.utils import timezone
from psycopg import IsolationLevel

from approvals.models import (
    Approval,
    Command,
    Epoch,
    Occurrence,
    Proposal,
    RetiredToken,
    Tenant,
    ToolContract,
)
from approvals.sql import Columns, fetch, on_postgresql, split


def parse_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def effective_approval_state(state: str, expires_at: datetime | None, now: datetime) -> str:
    """The state a person or runtime should see: an issued approval past its expiry is
    expired even before anything writes that down (``now == expires_at`` is expired)."""
    if state == Approval.State.ISSUED and expires_at is not None and expires_at <= now:
        return Approval.State.EXPIRED
    return state


def approval_state(approval: Approval, now: datetime | None = None) -> str:
    return effective_approval_state(approval.state, approval.expires_at, now or timezone.now())


@contextlib.contextmanager
def snapshot() -> Iterator[None]:
    """Reads inside see the database as of one moment.

    A read of an occurrence with its approvals, commands and epochs is several queries; at
    PostgreSQL's default isolation each sees what had committed when it began, so a decision
    committing between two of them would give an answer that never existed (status
    ``pending_review`` beside an issued approval). Here they share one REPEATABLE READ
    snapshot, read-only. SQLite's transaction is a snapshot already. Inside a transaction
    that has begun (a service's, a test's) the reads keep that transaction's isolation."""
    if connection.in_atomic_block:
        yield
        return
    if connection.vendor != "postgresql":
        with transaction.atomic():
            yield
        return
    # psycopg begins the transaction with its isolation level and access mode ("BEGIN
    # ISOLATION LEVEL REPEATABLE READ READ ONLY"): one round trip, not a BEGIN and a SET.
    connection.ensure_connection()
    raw = connection.connection
    level, read_only = raw.isolation_level, raw.read_only
    raw.isolation_level, raw.read_only = IsolationLevel.REPEATABLE_READ, True
    try:
        with transaction.atomic():
            yield
    finally:
        if not raw.closed:
            raw.isolation_level, raw.read_only = level, read_only


def _detail_prefetches() -> list[Prefetch[Any]]:
    return [
        Prefetch(
            "proposals", queryset=Proposal.objects.select_related("edited_by").order_by("version")
        ),
        Prefetch("approvals", queryset=Approval.objects.select_related("approver", "proposal")),
        Prefetch("commands", queryset=Command.objects.order_by("created_at")),
        Prefetch("epochs", queryset=Epoch.objects.order_by("number")),
    ]


def occurrence_detail_queryset() -> QuerySet[Occurrence]:
    return Occurrence.objects.select_related("tool", "tenant").prefetch_related(
        *_detail_prefetches()
    )


_OCCURRENCE = Columns(Occurrence, "o")
_TOOL = Columns(ToolContract, "t")
_TENANT = Columns(Tenant, "n")
# ``occurrence_detail_queryset``'s own statement, by id within a tenant, as SQL on
# PostgreSQL: the cheapest authenticated call (a GET of an unknown occurrence) paid Django
# more to build its three-table SELECT than PostgreSQL to run it (issue 28). The related
# lists are still read by the same Prefetch objects, with ``prefetch_related_objects``.
# The names are quoted as Django quotes them (tests/api/test_long_poll.py finds the read
# by its ``FROM "approvals_occurrence"``).
_DETAIL_SQL = " ".join(
    f"""SELECT {_OCCURRENCE.sql}, {_TOOL.sql}, {_TENANT.sql}
  FROM "{Occurrence._meta.db_table}" o
  JOIN "{ToolContract._meta.db_table}" t ON t.id = o.tool_id
  JOIN "{Tenant._meta.db_table}" n ON n.id = o.tenant_id
 WHERE o.tenant_id = %s AND o.id = %s""".split()  # noqa: S608 (no input in the text)
)


def occurrence_get_for_tenant(*, tenant: Tenant, occurrence_id: str) -> Occurrence | None:
    """The tenant's occurrence with what the API shows of it (``occurrence_detail_queryset``,
    the twin SQLite runs), read in one snapshot; None if there is none."""
    pk = parse_uuid(occurrence_id)
    if pk is None:
        return None
    with snapshot():
        if not on_postgresql():
            return occurrence_detail_queryset().filter(tenant=tenant, pk=pk).first()
        rows = fetch(_DETAIL_SQL, [tenant.pk, pk])
        if not rows:
            return None
        occurrence, tool, owner = split(rows[0], _OCCURRENCE, _TOOL, _TENANT)
        occurrence.tool = tool
        occurrence.tenant = owner
        prefetch_related_objects([occurrence], *_detail_prefetches())
        return occurrence


def occurrence_lookup(*, tenant: Tenant, run_id: str, client_ref: str) -> Occurrence | None:
    """The tenant's occurrence proposed with this ``client_ref`` in this run, if any."""
    with snapshot():
        return (
            occurrence_detail_queryset()
            .filter(tenant=tenant, run_id=run_id, client_ref=client_ref)
            .exclude(client_ref="")
            .first()
        )


def current_proposal(occurrence: Occurrence) -> Proposal:
    """The current version, from the prefetched proposals."""
    return next(p for p in occurrence.proposals.all() if p.is_current)


def current_approval(occurrence: Occurrence) -> Approval | None:
    """The approval of the current version, from the prefetched approvals."""
    proposal = current_proposal(occurrence)
    return next((a for a in occurrence.approvals.all() if a.proposal_id == proposal.pk), None)


def approvals_with_fingerprint(fingerprint: str) -> QuerySet[Approval]:
    """The approvals a token fingerprint names: the current token's, or one a re-delivery
    retired (a fingerprint seen in an old log line still names its approval)."""
    retired = RetiredToken.objects.filter(fingerprint=fingerprint).values("approval_id")
    return Approval.objects.filter(Q(fingerprint=fingerprint) | Q(pk__in=retired))


# An inbox row shows a tool's name, never its schema or description.
_INBOX_TOOL = Columns(ToolContract, "t", defer=("json_schema", "description"))
_TOOLS_SQL = f"SELECT {_INBOX_TOOL.sql} FROM approvals_toolcontract t ORDER BY t.name"  # noqa: S608


def tool_ids() -> dict[str, int]:
    """Tool contract ids by name, in name order: the inbox's tool filter."""
    if on_postgresql():
        return dict(fetch("SELECT t.name, t.id FROM approvals_toolcontract t ORDER BY t.name", []))
    return dict(ToolContract.objects.order_by("name").values_list("name", "id"))


def inbox_tools() -> dict[int, ToolContract]:
    """Every tool contract by id, in name order, without the schema and description an
    inbox row never shows: the inbox's tool filter, and the tool of each of its rows."""
    if on_postgresql():
        contracts = [_INBOX_TOOL.load(row) for row in fetch(_TOOLS_SQL, [])]
    else:
        contracts = list(ToolContract.objects.defer("json_schema", "description").order_by("name"))
    return {contract.pk: contract for contract in contracts}


def tool_contracts() -> list[ToolContract]:
    """Every tool contract, in name order."""
    return list(ToolContract.objects.order_by("name"))


_CONTRACT = Columns(ToolContract, "c")
_CONTRACT_SQL = f"SELECT {_CONTRACT.sql} FROM {ToolContract._meta.db_table} c WHERE c.name = %s"  # noqa: S608 (no input in the text)


def tool_contract(name: str) -> ToolContract | None:
    """The tool contract named ``name``, or None: every proposal and claim reads it. With
    SQL on PostgreSQL (its queryset, the twin SQLite runs, cost Django 0.6 ms of CPU to
    build, four times the statement's run). Read on every call, not cached in the process:
    an admin's edit does not bump its ``version`` (only a registration does), so no key
    would tell a stale copy, and knowing the version would be a read anyway."""
    if not on_postgresql():
        return ToolContract.objects.filter(name=name).first()
    rows = fetch(_CONTRACT_SQL, [name])
    return _CONTRACT.load(rows[0]) if rows else None
