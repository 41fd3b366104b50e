"""The queue's search: any id an operator holds (an occurrence, a command, an execution, an
idempotency key, an approval's fingerprint, a run, the runtime's reference, or an argument's
value such as a payment id or a recipient) names the occurrences it belongs to, whose items
the queue then lists. One statement on PostgreSQL, beside its ORM twin that the tests hold
equal."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.db.models import Exists, OuterRef, Q

from approvals.models import Approval, Command, Epoch, Occurrence, Proposal
from approvals.sql import fetch, on_postgresql

# An id is short; anything longer is not one, and is searched as typed up to this.
SEARCH_MAX = 200
# Occurrences one search may name: an id names a handful; a run many, still a bounded list.
SEARCH_LIMIT = 500

_SEARCH_SQL = """
SELECT o.id FROM approvals_occurrence o
 WHERE o.tenant_id = ANY(%(tenants)s) AND (
       o.id = %(pk)s OR o.run_id = %(q)s OR o.client_ref = %(q)s
    OR EXISTS (SELECT 1 FROM approvals_command c WHERE c.occurrence_id = o.id
               AND (c.id = %(pk)s OR c.execution_id = %(q)s OR c.idempotency_key = %(q)s))
    OR EXISTS (SELECT 1 FROM approvals_epoch e WHERE e.occurrence_id = o.id
               AND e.execution_id = %(q)s)
    OR EXISTS (SELECT 1 FROM approvals_approval a WHERE a.occurrence_id = o.id
               AND a.fingerprint = %(q)s)
    OR EXISTS (SELECT 1 FROM approvals_proposal p WHERE p.occurrence_id = o.id
               AND p.is_current AND p.canonical_action LIKE %(value)s ESCAPE '\\'))
 ORDER BY o.created_at
 LIMIT %(limit)s"""


def _as_value(q: str) -> str:
    """How the canonical JSON of an action (RFC 8785) writes an argument's value ``q``: a
    JSON string after its name's colon."""
    return ":" + json.dumps(q, ensure_ascii=False)


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _pk(q: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(q)
    except ValueError:
        return None


def queue_search(*, q: str, tenant_ids: list[int]) -> list[Any]:
    """The ids of the operator's occurrences that ``q`` names, oldest first."""
    q = q.strip()[:SEARCH_MAX]
    if not q:
        return []
    pk = _pk(q)
    if on_postgresql():
        params = {
            "tenants": tenant_ids,
            "pk": pk,
            "q": q,
            "value": _like(_as_value(q)),
            "limit": SEARCH_LIMIT,
        }
        return [row[0] for row in fetch(_SEARCH_SQL, params)]  # type: ignore[arg-type]
    return _queue_search_orm(q, pk, tenant_ids)


def _queue_search_orm(q: str, pk: uuid.UUID | None, tenant_ids: list[int]) -> list[Any]:
    """The ORM twin of ``_SEARCH_SQL``."""
    of = OuterRef("pk")
    by_pk = Q(pk=pk) if pk is not None else Q(pk__in=[])
    command_pk = Q(pk=pk) if pk is not None else Q(pk__in=[])
    named = (
        by_pk
        | Q(run_id=q)
        | Q(client_ref=q)
        | Exists(
            Command.objects.filter(occurrence_id=of).filter(
                command_pk | Q(execution_id=q) | Q(idempotency_key=q)
            )
        )
        | Exists(Epoch.objects.filter(occurrence_id=of, execution_id=q))
        | Exists(Approval.objects.filter(occurrence_id=of, fingerprint=q))
        | Exists(
            Proposal.objects.filter(
                occurrence_id=of, is_current=True, canonical_action__contains=_as_value(q)
            )
        )
    )
    return list(
        Occurrence.objects.filter(named, tenant_id__in=tenant_ids)
        .order_by("created_at")
        .values_list("pk", flat=True)[:SEARCH_LIMIT]
    )
