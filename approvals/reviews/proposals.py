"""Proposing: a runtime's tool call validated against its contract, canonicalized, and
recorded as an occurrence with its first proposal version (idempotent per run and
``client_ref``); and the run's earlier rejections of the same action."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import (
    Exists,
    F,
    OuterRef,
    QuerySet,
    Subquery,
)

from approvals import sql, vocabulary
from approvals.audit.record import audit_append, audit_event_new, audit_record, db_now
from approvals.callbacks.outbox import callback_delivery_create
from approvals.canonical.form import CanonicalAction, canonicalize
from approvals.canonical.schema import validate_arguments
from approvals.errors import ErrorCode, InputError, ServiceError
from approvals.models import (
    AuditEvent,
    Epoch,
    NotificationEvent,
    Occurrence,
    Proposal,
    RuntimeKey,
    Tenant,
    ToolContract,
)
from approvals.notifications.outbox import notification_event_create
from approvals.reviews.deadlines import deadlines_now
from approvals.reviews.selectors import tool_contract
from approvals.routing.rules import routing_version
from approvals.vocabulary import (
    AuditKind,
    EventDecision,
    EventReason,
)


def action_canonical(tool: str, arguments: Any) -> tuple[ToolContract, CanonicalAction]:
    """The tool's contract and the action's canonical form and digest, or the InputError a
    proposal of it gets (unknown tool, arguments outside the contract). Writes nothing."""
    contract = tool_contract(tool)
    if contract is None:
        raise InputError("unknown_tool", f"There is no tool contract named {tool!r}.", "tool")
    validate_arguments(contract.json_schema, arguments)
    return contract, canonicalize(tool, arguments)


@dataclass(frozen=True)
class Proposed:
    """What ``proposal_record`` did: the occurrence, the proposal it wrote (None for a
    retry, which answers with the first occurrence as it is now) and whether it is new."""

    occurrence: Occurrence
    proposal: Proposal | None
    created: bool


def occurrence_propose(
    *,
    runtime_key: RuntimeKey,
    tool: str,
    arguments: Any,
    run_id: str,
    reason: str,
    requested_by: str = "",
    client_ref: str = "",
) -> tuple[Occurrence, bool]:
    """Record a proposed tool call (``proposal_record``). Returns the occurrence and
    whether it is new."""
    proposed = proposal_record(
        runtime_key=runtime_key,
        tool=tool,
        arguments=arguments,
        run_id=run_id,
        reason=reason,
        requested_by=requested_by,
        client_ref=client_ref,
    )
    return proposed.occurrence, proposed.created


def proposal_record(
    *,
    runtime_key: RuntimeKey,
    tool: str,
    arguments: Any,
    run_id: str,
    reason: str,
    requested_by: str = "",
    client_ref: str = "",
) -> Proposed:
    """Record a proposed tool call.

    A retried proposal with the same ``client_ref`` in the same run returns the first
    occurrence; the same ``client_ref`` with a different action is refused, not silently
    merged. Another run may use the same ``client_ref`` (frameworks reuse tool-call ids).

    When the contract sets ``reject_repeats`` and a reviewer already rejected this action
    (same digest) in the same run, the new occurrence is rejected at once by policy, with
    the original reason (audited as ``occurrence.rejected``, reason ``repeat_of_rejected``).

    A new occurrence comes back with the proposal that was written (and its tool and
    tenant), so an answer needs no read of them. A retry is found by
    the unique constraint on (tenant, run, ``client_ref``), not by a read before every
    insert: its insert fails, the savepoint rolls back, and the first occurrence is read.
    """
    tenant = runtime_key.tenant
    contract, action = action_canonical(tool, arguments)

    auto = contract.auto_admit and contract.replay_safety == ToolContract.ReplaySafety.READ_ONLY
    repeat_of = None
    if contract.reject_repeats and not auto:
        prior = prior_rejections(tenant=tenant, run_id=run_id, action_digest=action.digest, limit=1)
        repeat_of = prior[0] if prior else None
    try:
        with transaction.atomic():
            deadlines = {} if auto else deadlines_now(contract)
            # The routing rule's version is picked inside the INSERT (a subquery): routing
            # costs the proposal no query of its own.
            routing = (
                {}
                if auto
                else {
                    "routed_by_id": routing_version(
                        tenant_id=tenant.pk, contract=contract, arguments=arguments
                    )
                }
            )
            occurrence = Occurrence.objects.create(
                tenant=tenant,
                runtime_key=runtime_key,
                tool=contract,
                run_id=run_id,
                reason=reason,
                requested_by=requested_by,
                client_ref=client_ref,
                status=Occurrence.Status.AUTO_ADMITTED
                if auto
                else Occurrence.Status.PENDING_REVIEW,
                admission_justification=Epoch.Justification.READ_ONLY.value if auto else "",
                **deadlines,
                **routing,
            )
            # The instance holds the subquery, not the version it chose; dropping the value
            # makes its next access read the database's (a deferred field). The public
            # ways cost or cannot: ``refresh_from_db(fields=...)`` is a statement on every
            # proposal (nothing in it needs the value), ``del occurrence.routed_by_id``
            # fails (a foreign key's descriptor has no ``__delete__``), and RETURNING the
            # column needs a ``db_default`` on it, which would change every unsaved
            # occurrence's ``routed_by_id`` into a ``DatabaseDefault``.
            occurrence.__dict__.pop("routed_by_id", None)
            proposal = Proposal.objects.create(
                occurrence=occurrence,
                version=1,
                canonical_action=action.canonical,
                action_digest=action.digest,
            )
            events = [
                audit_event_new(
                    kind=AuditKind.OCCURRENCE_PROPOSED,
                    tenant=tenant,
                    occurrence=occurrence,
                    actor=f"runtime:{runtime_key.name}",
                    data={
                        "tool": tool,
                        "version": 1,
                        "action_digest": action.digest,
                        "run_id": run_id,
                    },
                )
            ]
            if auto:
                events.append(
                    audit_event_new(
                        kind=AuditKind.OCCURRENCE_AUTO_ADMITTED,
                        tenant=tenant,
                        occurrence=occurrence,
                        actor="policy",
                        decision=EventDecision.AUTO_ADMITTED,
                        reason_code=EventReason.POLICY_READ_ONLY,
                        data={"justification": "The tool contract is read-only and auto-admitted."},
                    )
                )
            audit_append(events)
            if repeat_of is not None:
                _reject_repeat(occurrence, repeat_of)
            elif not auto:
                # The notification outbox: the reviewers hear of it after commit.
                notification_event_create(
                    tenant_id=tenant.pk,
                    occurrence_id=occurrence.pk,
                    kind=NotificationEvent.Kind.REQUESTED,
                )
    except IntegrityError:
        # Another request with the same client_ref won the insert.
        existing = (
            _existing_for_client_ref(tenant, run_id, client_ref, action.digest)
            if client_ref
            else None
        )
        if existing is None:
            raise
        return Proposed(existing, None, False)
    return Proposed(occurrence, proposal, True)


def _reject_repeat(occurrence: Occurrence, repeat_of: PriorDecision) -> None:
    """Reject a new occurrence by policy: it repeats an action rejected in its run."""
    now = db_now()
    Occurrence.objects.filter(pk=occurrence.pk).update(
        status=Occurrence.Status.REJECTED,
        rejection_reason=repeat_of.reason,
        decided_at=now,
        updated_at=now,
    )
    # What the UPDATE wrote, without reading it back.
    occurrence.status = Occurrence.Status.REJECTED
    occurrence.rejection_reason = repeat_of.reason
    occurrence.decided_at = occurrence.updated_at = now
    callback_delivery_create(
        audit_record(
            kind=AuditKind.OCCURRENCE_REJECTED,
            tenant=occurrence.tenant_id,
            occurrence=occurrence,
            actor="policy",
            decision=EventDecision.REJECTED,
            reason_code=EventReason.REPEAT_OF_REJECTED,
            data={
                "reason": repeat_of.reason,
                "repeat_of": str(repeat_of.occurrence_id),
                "justification": "The same action was rejected earlier in this run and the "
                "tool contract rejects repeats.",
            },
        )
    )


def _existing_for_client_ref(
    tenant: Tenant, run_id: str, client_ref: str, digest: str
) -> Occurrence | None:
    existing = Occurrence.objects.filter(
        tenant=tenant, run_id=run_id, client_ref=client_ref
    ).first()
    if existing is None:
        return None
    first = existing.proposals.get(version=1)
    if first.action_digest != digest:
        raise ServiceError(
            ErrorCode.CLIENT_REF_CONFLICT,
            "This client_ref was already used in this run for a different action.",
            409,
            details={"occurrence_id": str(existing.pk)},
        )
    return existing


# Prior decisions listed in a proposal's answer: the newest ones.
PRIOR_DECISIONS_LIMIT = 20


@dataclass(frozen=True)
class PriorDecision:
    """An earlier occurrence of the same run, with the same action, that was rejected or
    timed out (nobody decided it before its final deadline)."""

    occurrence_id: uuid.UUID
    decision: str  # EventDecision.REJECTED or TIMED_OUT
    reason: str
    decided_at: datetime | None
    decided_by: str  # the reviewer's username, "policy" (a repeat) or "console" (timeout)


TIMED_OUT_REASON = "Nobody decided it before its final deadline."


def prior_rejections(
    *,
    tenant: Tenant | int,
    run_id: str,
    action_digest: str,
    exclude: uuid.UUID | None = None,
    limit: int = PRIOR_DECISIONS_LIMIT,
    with_timeouts: bool = False,
) -> list[PriorDecision]:
    """Rejected occurrences of the run whose action (any version of it) had this digest,
    newest decision first; with ``with_timeouts``, timed-out ones too (what an answer's
    ``prior_decisions`` lists; a repeat is rejected by policy only after a rejection)."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    statuses: list[str] = [Occurrence.Status.REJECTED]
    if with_timeouts:
        statuses.append(Occurrence.Status.TIMED_OUT)
    if sql.on_postgresql():
        rows = _prior_rejections_sql(tenant_id, run_id, action_digest, statuses, exclude, limit)
    else:
        rows = [
            (
                row["pk"],
                row["status"],
                row["rejection_reason"],
                row["decided_at"],
                row["decided_by"],
            )
            for row in prior_rejections_queryset(
                tenant_id=tenant_id,
                run_id=run_id,
                action_digest=action_digest,
                statuses=statuses,
                exclude=exclude,
            )[:limit]
        ]
    return [
        PriorDecision(
            occurrence_id=pk,
            decision=vocabulary.EventDecision.TIMED_OUT
            if status == Occurrence.Status.TIMED_OUT
            else vocabulary.EventDecision.REJECTED,
            reason=TIMED_OUT_REASON if status == Occurrence.Status.TIMED_OUT else reason,
            decided_at=decided_at,
            decided_by=decided_by or "",
        )
        for pk, status, reason, decided_at, decided_by in rows
    ]


def prior_rejections_queryset(
    *,
    tenant_id: int,
    run_id: str,
    action_digest: str,
    statuses: list[str],
    exclude: uuid.UUID | None = None,
) -> QuerySet[Any, dict[str, Any]]:
    """``prior_rejections``' rows as a queryset: what SQLite runs, and the twin
    ``tests/approvals/test_hot_path_sql.py`` holds the SQL equal to."""
    rejected = (
        Occurrence.objects.filter(tenant_id=tenant_id, run_id=run_id, status__in=statuses)
        .filter(
            Exists(
                Proposal.objects.filter(occurrence_id=OuterRef("pk"), action_digest=action_digest)
            )
        )
        .annotate(
            decided_by=Subquery(
                AuditEvent.objects.filter(
                    occurrence_id=OuterRef("pk"),
                    kind__in=[AuditKind.OCCURRENCE_REJECTED, AuditKind.OCCURRENCE_TIMED_OUT],
                )
                .order_by("-id")
                .values("actor")[:1]
            )
        )
        .order_by(F("decided_at").desc(nulls_last=True), "-created_at")
    )
    if exclude is not None:
        rejected = rejected.exclude(pk=exclude)
    return rejected.values("pk", "status", "rejection_reason", "decided_at", "decided_by")


_DECISIVE = sql.words([AuditKind.OCCURRENCE_REJECTED, AuditKind.OCCURRENCE_TIMED_OUT])
# Written as SQL on PostgreSQL: every proposal's answer asks it (and it almost always
# finds nothing); its queryset cost Django 1.9 ms of CPU to build, ten times its run.
_PRIOR_SQL = " ".join(
    f"""SELECT o.id, o.status, o.rejection_reason, o.decided_at,
       (SELECT a.actor FROM {AuditEvent._meta.db_table} a
         WHERE a.kind IN ({_DECISIVE})
           AND a.occurrence_id = o.id
         ORDER BY a.id DESC LIMIT 1)
  FROM {Occurrence._meta.db_table} o
 WHERE o.run_id = %s AND o.status IN ({{statuses}}) AND o.tenant_id = %s
   AND EXISTS (SELECT 1 FROM {Proposal._meta.db_table} p
                WHERE p.action_digest = %s AND p.occurrence_id = o.id){{exclude}}
 ORDER BY o.decided_at DESC NULLS LAST, o.created_at DESC
 LIMIT %s""".split()  # noqa: S608 (no input in the text)
)


def _prior_rejections_sql(
    tenant_id: int,
    run_id: str,
    action_digest: str,
    statuses: list[str],
    exclude: uuid.UUID | None,
    limit: int,
) -> list[tuple[Any, ...]]:
    text = _PRIOR_SQL.format(
        statuses=sql.words(statuses), exclude=" AND o.id <> %s" if exclude else ""
    )
    params: list[Any] = [run_id, tenant_id, action_digest]
    if exclude is not None:
        params.append(exclude)
    return sql.fetch(text, [*params, limit])
