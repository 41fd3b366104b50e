"""Bulk review: one reviewer decides several pending requests of one tool in one submission.

Each request is decided by the single-request service (``occurrence_approve``,
``occurrence_reject``), so quorum, self-approval and role rules apply to each one as if it
were decided on its own page, and each decision is audited on its own request with the
batch's id in its data (``batch``). What makes it a batch is all or nothing: the requests'
rows are locked in primary-key order (the order every batch takes them, so two batches
cannot deadlock), each is checked against the version and digest the reviewer was shown,
and if any one changed, was decided, timed out, or is refused by a rule, nothing is
written and the refusal names that request.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from approvals.access.tenancy import User
from approvals.audit.record import db_now
from approvals.errors import ErrorCode, InputError, ServiceError
from approvals.models import Occurrence, Proposal
from approvals.reviews.deadlines import require_before_final_deadline
from approvals.reviews.decisions import (
    ApproveOutcome,
    occurrence_approve,
    occurrence_reject,
)

# The most requests one submission decides: the page says so, and each one is still shown
# in full (its canonical JSON and digest) before it is decided.
BULK_MAX = 50


@dataclass(frozen=True)
class BulkItem:
    """One request of a batch, as the page showed it: the version and its digest."""

    occurrence_id: uuid.UUID
    version: int
    digest: str


@dataclass(frozen=True)
class BulkDecided:
    """One request's outcome in a batch that was written."""

    occurrence_id: uuid.UUID
    issued: bool  # approve: the approval was issued (the quorum was reached)
    votes: int = 0
    needed: int = 0


@dataclass(frozen=True)
class BulkResult:
    batch_id: uuid.UUID
    decided: list[BulkDecided]

    @property
    def issued(self) -> int:
        return sum(1 for d in self.decided if d.issued)


def _checked(items: Sequence[BulkItem]) -> list[BulkItem]:
    """The batch's shape: 1 to ``BULK_MAX`` distinct requests, in primary-key order."""
    if not items:
        raise InputError("batch_empty", "Select at least one request.", "occurrences")
    if len(items) > BULK_MAX:
        raise InputError(
            "batch_too_large",
            f"A bulk review decides at most {BULK_MAX} requests; {len(items)} were selected.",
            "occurrences",
        )
    ids = [item.occurrence_id for item in items]
    if len(set(ids)) != len(ids):
        raise InputError("batch_duplicate", "A request was selected twice.", "occurrences")
    return sorted(items, key=lambda item: item.occurrence_id)


def _refused(error: ServiceError, occurrence_id: uuid.UUID, batch_id: uuid.UUID) -> ServiceError:
    """A member's refusal as the batch's: nothing was decided, and this request is why."""
    short = str(occurrence_id)[:8]
    return ServiceError(
        error.code,
        f"Nothing was decided: request {short} stopped the batch. {error.message}",
        error.status,
        details={
            **(error.details or {}),
            "occurrence_id": str(occurrence_id),
            "batch_id": str(batch_id),
        },
    )


def _check(
    occ: Occurrence | None, proposal: Proposal | None, item: BulkItem, now: datetime
) -> None:
    """One member against what the page showed: still pending, in time, the same version."""
    if occ is None or proposal is None:
        raise ServiceError(ErrorCode.NOT_FOUND, "There is no such request in your tenants.", 404)
    require_before_final_deadline(occ, now)
    if occ.status != Occurrence.Status.PENDING_REVIEW:
        raise ServiceError(
            ErrorCode.NOT_PENDING,
            "It was decided since the page was rendered "
            f"(it is {occ.get_status_display().lower()}).",
        )
    if proposal.version != item.version or not hmac.compare_digest(
        item.digest.encode(), proposal.action_digest.encode()
    ):
        raise ServiceError(
            ErrorCode.STALE_DIGEST,
            f"It changed since the page was rendered (version {item.version} was shown, "
            f"version {proposal.version} is current). Review it again.",
            details={"version": proposal.version, "action_digest": proposal.action_digest},
        )


def _lock(
    items: list[BulkItem], tenant_ids: Iterable[int], batch_id: uuid.UUID
) -> dict[uuid.UUID, Occurrence]:
    """Lock the batch's rows, in primary-key order, and check each against what was shown.
    A request outside ``tenant_ids`` is refused as if it did not exist."""
    ids = [item.occurrence_id for item in items]
    locked = {
        occ.pk: occ
        for occ in Occurrence.objects.select_for_update(of=("self",))
        .select_related("tool", "tenant")
        .filter(pk__in=ids, tenant_id__in=list(tenant_ids))
        .order_by("pk")
    }
    current = {
        p.occurrence_id: p
        for p in Proposal.objects.filter(occurrence_id__in=list(locked), is_current=True).only(
            "occurrence_id", "version", "action_digest"
        )
    }
    now = db_now()
    for item in items:
        pk = item.occurrence_id
        try:
            _check(locked.get(pk), current.get(pk), item, now)
        except ServiceError as error:
            raise _refused(error, pk, batch_id) from error
    if len({occ.tool_id for occ in locked.values()}) > 1:
        raise InputError(
            "batch_mixed_tools", "A bulk review decides requests of one tool.", "occurrences"
        )
    return locked


def occurrences_approve(
    *,
    reviewer: User,
    items: Sequence[BulkItem],
    tenant_ids: Iterable[int],
    batch_id: uuid.UUID | None = None,
) -> BulkResult:
    """Approve every request of the batch, each bound to the digest shown for it, or none.

    Each approval is ``occurrence_approve``'s (a vote, and the approval once the request's
    quorum is reached); a refusal of any one request (changed, decided, timed out, the
    reviewer's own, not a reviewer of its tenant, another tenant's) rolls the whole batch
    back and names that request in ``details["occurrence_id"]``."""
    ordered = _checked(items)
    batch = batch_id or uuid.uuid4()
    decided: list[BulkDecided] = []
    with transaction.atomic():
        locked = _lock(ordered, tenant_ids, batch)
        for item in ordered:
            try:
                outcome: ApproveOutcome = occurrence_approve(
                    occurrence=locked[item.occurrence_id],
                    reviewer=reviewer,
                    seen_digest=item.digest,
                    batch=str(batch),
                )
            except ServiceError as error:
                raise _refused(error, item.occurrence_id, batch) from error
            decided.append(
                BulkDecided(item.occurrence_id, outcome.issued, outcome.votes, outcome.needed)
            )
    return BulkResult(batch, decided)


def occurrences_reject(
    *,
    reviewer: User,
    items: Sequence[BulkItem],
    tenant_ids: Iterable[int],
    reason: str,
    batch_id: uuid.UUID | None = None,
) -> BulkResult:
    """Reject every request of the batch with one reason, or none (as ``occurrences_approve``:
    each one as shown, each by ``occurrence_reject``, audited with the batch's id)."""
    ordered = _checked(items)
    if not (reason or "").strip():
        raise InputError("reason_required", "Say why you reject these requests.", "reason")
    batch = batch_id or uuid.uuid4()
    decided: list[BulkDecided] = []
    with transaction.atomic():
        locked = _lock(ordered, tenant_ids, batch)
        for item in ordered:
            try:
                occurrence_reject(
                    occurrence=locked[item.occurrence_id],
                    reviewer=reviewer,
                    reason=reason,
                    batch=str(batch),
                )
            except ServiceError as error:
                raise _refused(error, item.occurrence_id, batch) from error
            decided.append(BulkDecided(item.occurrence_id, issued=False))
    return BulkResult(batch, decided)
