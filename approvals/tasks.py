"""Celery tasks of the authority app. A task only decides which service to call. The
callbacks' tasks are in ``approvals.callbacks.tasks``."""

from __future__ import annotations

import structlog
from celery import shared_task
from django.db import DatabaseError

from approvals.audit.chain import audit_chain_extend, audit_tenants_unchained
from approvals.reviews import deadlines, expiry

log = structlog.get_logger("approvals")


@shared_task(ignore_result=True)
def audit_chain_extend_all() -> int:
    """Chain every tenant's new audit events (Celery beat, every few seconds), so that the
    hash chain is never more than a few seconds behind the trail and the claims that write
    the events never wait for it. Returns how many tenants it looked at.

    A tenant whose chain cannot be extended (its chain was tampered with: a forged
    ``chain_seq`` is in the way) is logged and left for ``verify_audit_chain`` to name;
    the other tenants are chained all the same."""
    tenant_ids = audit_tenants_unchained()
    for tenant_id in tenant_ids:
        try:
            audit_chain_extend(tenant_id=tenant_id)
        except DatabaseError as exc:
            log.error("audit.chain_extend_failed", tenant_id=tenant_id, error=str(exc))
    return len(tenant_ids)


# Batches one run of the expiry sweep takes at most; the next run takes the rest.
EXPIRE_BATCHES_PER_RUN = 20


@shared_task(ignore_result=True)
def approvals_expire() -> int:
    """Write down what the clock already decided (Celery beat, every minute): each issued
    approval past its expiry becomes ``expired``, audited, and so does its occurrence, so
    that the inbox's filters and counts agree with its badges. Returns how many."""
    expired = 0
    for _ in range(EXPIRE_BATCHES_PER_RUN):
        batch = expiry.approvals_expire()
        expired += batch
        if batch < expiry.EXPIRE_BATCH:
            break
    return expired


# Batches one run of the deadlines sweep takes at most; the next run takes the rest.
DEADLINES_BATCHES_PER_RUN = 20


@shared_task(ignore_result=True)
def review_deadlines_sweep() -> int:
    """Write down what the clock decided for pending requests (Celery beat, every few
    seconds): past the contract's review deadline a request is escalated, past its final
    deadline it ends ``timed_out`` (audited, told to the runtime's callback). Approve and
    reject refuse from the instant the final deadline passes, so a late sweep only delays
    the record, never lets an approval through. Returns how many requests it changed."""
    changed = 0
    for _ in range(DEADLINES_BATCHES_PER_RUN):
        escalated, timed_out = deadlines.review_deadlines_apply()
        changed += escalated + timed_out
        if escalated < deadlines.DEADLINES_BATCH and timed_out < deadlines.DEADLINES_BATCH:
            break
    return changed
