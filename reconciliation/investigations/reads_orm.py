"""The ORM twins of the investigation's reads (``reconciliation.investigations.reads``):
what SQLite runs, and what the tests hold the PostgreSQL statements equal to. The same
arguments, the same rows in the same order."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db.models import F, OuterRef, Q, QuerySet, Subquery

from approvals import vocabulary
from approvals.models import (
    DECISIVE_EVENTS,
    Approval,
    AuditDuplicateDelivery,
    AuditEvent,
    AuditIngestion,
    Command,
    Occurrence,
    Proposal,
)
from reconciliation.investigations.access import User
from reconciliation.models import AdapterInvocation, OperatorDecision


@dataclass(frozen=True)
class Chain:
    """What an investigation's chain of events is made of: what was asked (``q``, and
    ``pk`` when it is a UUID), the investigator's tenants, and the occurrences,
    fingerprints and commands gathered around it."""

    q: str
    pk: uuid.UUID | None
    tenant_ids: list[int]
    occurrence_ids: list[Any]
    fingerprints: list[str]
    command_ids: list[Any]


# The approval's columns ``ApprovalFact`` is built from.
APPROVAL_FIELDS = (
    "id",
    "tenant_id",
    "occurrence_id",
    "fingerprint",
    "state",
    "expires_at",
    "consumed_by_execution",
    "issued_at",
    "delivered_at",
    "approver_id",
)

# The occurrence's columns the page shows.
OCCURRENCE_FIELDS = ("id", "tenant", "tool", "status", "created_at")


def _in(lookup: str, values: list[Any]) -> Q:
    return Q(**{f"{lookup}__in": values}) if values else Q(pk__in=[])


def _has_fingerprint() -> Q:
    return ~Q(token_fingerprint="")


def seeds(*, q: str, pk: uuid.UUID | None, tenant_ids: list[int], limit: int) -> list[Any]:
    named = (Q(token_fingerprint=q) & _has_fingerprint()) | (
        Q(execution_id=q) & ~Q(execution_id="")
    )
    if pk is not None:
        named |= Q(occurrence_id=pk) | Q(command_id=pk, ingestion__isnull=False)
    return list(
        AuditEvent.objects.filter(tenant_id__in=tenant_ids)
        .filter(named)
        .order_by()
        .values_list("token_fingerprint", "occurrence_id", "command_id")
        .distinct()[:limit]
    )


def seed_approvals(*, q: str, pk: uuid.UUID | None, tenant_ids: list[int], limit: int) -> list[Any]:
    named = Q(fingerprint=q) | (Q(occurrence_id=pk) if pk is not None else Q(pk__in=[]))
    return list(
        Approval.objects.filter(tenant_id__in=tenant_ids)
        .filter(named)
        .order_by()
        .values_list("occurrence_id", "fingerprint")[:limit]
    )


def seed_commands(*, pk: uuid.UUID, tenant_ids: list[int], limit: int) -> list[Any]:
    return list(
        Command.objects.filter(tenant_id__in=tenant_ids)
        .filter(Q(pk=pk) | Q(occurrence_id=pk))
        .order_by()
        .values_list("pk", "occurrence_id")[:limit]
    )


def approvals(
    *, tenant_ids: list[int], occurrence_ids: list[Any], fingerprints: list[str], limit: int
) -> list[Approval]:
    return list(
        Approval.objects.filter(tenant_id__in=tenant_ids)
        .filter(_in("occurrence_id", occurrence_ids) | _in("fingerprint", fingerprints))
        .select_related("approver")
        .only(*APPROVAL_FIELDS, f"approver__{User.USERNAME_FIELD}")
        .order_by("issued_at", "pk")[:limit]
    )


def occurrences(*, tenant_ids: list[int], occurrence_ids: list[Any]) -> list[Occurrence]:
    return list(
        Occurrence.objects.filter(tenant_id__in=tenant_ids)
        .filter(_in("pk", occurrence_ids))
        .select_related("tool", "tenant")
        .only(*OCCURRENCE_FIELDS, "tool__name", "tenant__name")
        .annotate(
            current_action=Subquery(
                Proposal.objects.filter(occurrence=OuterRef("pk"), is_current=True).values(
                    "canonical_action"
                )[:1]
            )
        )
        .order_by("created_at")
    )


def commands(
    *, tenant_ids: list[int], occurrence_ids: list[Any], command_ids: list[Any], limit: int
) -> list[Command]:
    return list(
        Command.objects.filter(tenant_id__in=tenant_ids)
        .filter(_in("occurrence_id", occurrence_ids) | _in("pk", command_ids))
        .order_by("created_at")[:limit]
    )


def invocations(*, command_ids: list[Any]) -> list[AdapterInvocation]:
    return list(
        AdapterInvocation.objects.filter(_in("command_id", command_ids))
        .select_related("epoch")
        .order_by("command_id", "number")
    )


def decisions(*, command_ids: list[Any]) -> list[OperatorDecision]:
    return list(
        OperatorDecision.objects.filter(_in("command_id", command_ids)).order_by("created_at", "pk")
    )


# --- the chain of events ----------------------------------------------------------------

# What ``EventFact`` holds, in its order (``receipt_value``: the payload's "receipt").
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
    "receipt_value",
    "ingestion_id",
    "ingested_at",
)


def chain_q(chain: Chain) -> Q:
    """The events the chain names."""
    named = (Q(token_fingerprint=chain.q) & _has_fingerprint()) | (
        Q(execution_id=chain.q) & ~Q(execution_id="")
    )
    if chain.pk is not None:
        named |= Q(occurrence_id=chain.pk) | Q(command_id=chain.pk, ingestion__isnull=False)
    if chain.occurrence_ids:
        named |= Q(occurrence_id__in=chain.occurrence_ids)
    if chain.fingerprints:
        named |= Q(token_fingerprint__in=chain.fingerprints) & _has_fingerprint()
    if chain.command_ids:
        named |= Q(command_id__in=chain.command_ids, ingestion__isnull=False)
    return named


def _events(chain: Chain) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(tenant_id__in=chain.tenant_ids).filter(chain_q(chain))


def _facts(rows: QuerySet[AuditEvent]) -> list[tuple[Any, ...]]:
    """Rows in ``EventFact``'s order and form: ids as text ("" for none), and the receipt
    only where an effect event names one as a string."""
    found = []
    for row in rows.annotate(receipt_value=F("data__receipt")).values_list(*_EVENT_COLUMNS):
        pk, event_id, kind, *middle, command_id, occurrence_id, receipt, ingestion, at = row
        effect = isinstance(receipt, str) and kind.startswith(vocabulary.EFFECT_PREFIX)
        found.append(
            (
                pk,
                str(event_id),
                kind,
                *middle,
                "" if command_id is None else str(command_id),
                "" if occurrence_id is None else str(occurrence_id),
                receipt if effect else "",
                ingestion,
                at,
            )
        )
    return found


def newest(chain: Chain, limit: int) -> list[tuple[Any, ...]]:
    """The chain's newest ``limit`` events, newest first (the chain sorted whole)."""
    return _facts(_events(chain).order_by("-id")[:limit])


def decisive(chain: Chain, limit: int) -> list[tuple[Any, ...]]:
    """The chain's oldest ``limit`` approved decisions and committed effects."""
    return _facts(_events(chain).filter(DECISIVE_EVENTS).order_by("id")[:limit])


def count(chain: Chain) -> int:
    return _events(chain).count()


def deliveries(*, tenant_ids: list[int], event_ids: list[int]) -> list[AuditDuplicateDelivery]:
    return list(
        AuditDuplicateDelivery.objects.filter(tenant_id__in=tenant_ids, original_id__in=event_ids)
        .select_related("ingestion")
        .order_by("id")
    )


def producers(*, ingestion_ids: list[int]) -> dict[int, str]:
    rows = AuditIngestion.objects.filter(pk__in=ingestion_ids).values_list(
        "pk", "runtime_key__name"
    )
    return {batch: name or "" for batch, name in rows}
