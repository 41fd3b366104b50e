"""Token delivery: the approval's raw token minted and handed out once (or once per ask of
the execution it is bound to), its hash kept."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import NoReturn

from django.db import transaction
from django.views.decorators.debug import sensitive_variables

from approvals.access import tokens
from approvals.access.runtime_keys import runtime_actor, runtime_key_may_act_for
from approvals.audit.record import DbNow, audit_record
from approvals.errors import ErrorCode, ServiceError
from approvals.models import (
    Approval,
    Command,
    Occurrence,
    RetiredToken,
    RuntimeKey,
)
from approvals.reviews.decisions import rejection_details
from approvals.vocabulary import (
    AuditKind,
)


@dataclass(frozen=True)
class DeliveredToken:
    token: str
    approval: Approval
    redelivered: bool = False  # a fresh token for the execution the approval is bound to


def _current_approval(occurrence: Occurrence) -> Approval | None:
    return Approval.objects.filter(occurrence=occurrence, proposal__is_current=True).first()


def pickup_read(
    *, tenant_id: int, occurrence_id: uuid.UUID
) -> tuple[Occurrence, Approval | None] | None:
    """The tenant's occurrence and the approval of its current version, for a pickup: one
    query when there is such an approval (a pickup that hands out a token), and a second,
    of the occurrence alone, when there is none (the pickup is refused, saying why). None
    when the tenant has no such occurrence."""
    # At most one row (one current proposal, one approval per proposal), so no ORDER BY:
    # with one (first()), a prepared statement's generic plan walked the approvals' primary
    # key in order, filtering on the occurrence, slower with every approval ever issued.
    found = (
        Approval.objects.select_related("occurrence")
        .filter(
            occurrence_id=occurrence_id,
            occurrence__tenant_id=tenant_id,
            proposal__is_current=True,
        )
        .order_by()[:1]
    )
    approval = next(iter(found), None)
    if approval is not None:
        return approval.occurrence, approval
    occurrence = Occurrence.objects.filter(tenant_id=tenant_id, pk=occurrence_id).first()
    return None if occurrence is None else (occurrence, None)


def approval_deliver_token(
    *, occurrence: Occurrence, runtime_key: RuntimeKey | None = None, execution_id: str = ""
) -> DeliveredToken:
    """``approval_deliver`` with the occurrence's current approval read here."""
    return approval_deliver(
        occurrence=occurrence,
        approval=_current_approval(occurrence),
        runtime_key=runtime_key,
        execution_id=execution_id,
    )


@sensitive_variables("raw")
def approval_deliver(
    *,
    occurrence: Occurrence,
    approval: Approval | None,
    runtime_key: RuntimeKey | None = None,
    execution_id: str = "",
) -> DeliveredToken:
    """Mint the approval's token and hand it out: once, or once per ask of one execution.
    ``approval`` is the occurrence's current version's, as read (``pickup_read``), or None.

    The token exists in memory only for this response; the database keeps its hash.
    With ``runtime_key`` (the API's caller), only the key that proposed the occurrence, or
    a key of the same ``runtime_group``, may pick it up: another key of the tenant gets
    ``403 other_runtime_key`` and nothing changes. Without it (a caller inside the console),
    the audit event's actor is ``runtime``.

    Without ``execution_id`` the token is handed out once; every later ask is
    ``409 token_already_delivered`` (API v1 as first shipped). With one, the first pickup
    binds the approval to that execution: only it may claim, and while the approval is
    unclaimed it may ask again, after a crash that lost the token. Each such ask mints a
    fresh token and retires the previous one (its hash is kept, so a claim with it is a
    named replay, ``token_redelivered``), audited as ``token.redelivered``. Another
    execution's ask stays ``409 token_already_delivered``; an ask after the claim is
    ``409 claimed`` with the command.
    """
    if runtime_key is not None and not runtime_key_may_act_for(
        runtime_key, occurrence.runtime_key_id
    ):
        raise ServiceError(
            ErrorCode.OTHER_RUNTIME_KEY,
            "Another runtime key proposed this request; only that key, or a key an admin "
            "put in the same runtime group, may pick up its token.",
            403,
        )
    if approval is None:
        if occurrence.status == Occurrence.Status.REJECTED:
            raise ServiceError(
                ErrorCode.REJECTED,
                f"A reviewer rejected this request: {occurrence.rejection_reason}",
                details=rejection_details(occurrence),
            )
        if occurrence.status == Occurrence.Status.AUTO_ADMITTED:
            raise ServiceError(
                ErrorCode.AUTO_ADMITTED, "This call was admitted by policy; it needs no token."
            )
        if occurrence.status == Occurrence.Status.TIMED_OUT:
            raise ServiceError(
                ErrorCode.TIMED_OUT,
                "Nobody decided this request before its final deadline: it timed out and "
                "will never be approved. Propose the action again to ask again.",
            )
        raise ServiceError(ErrorCode.NOT_APPROVED, "This request has not been approved yet.")

    raw = tokens.mint(tokens.APPROVAL_TOKEN_PREFIX)
    fingerprint = tokens.fingerprint(raw)
    token_hash = tokens.hash_secret(raw)
    deliverable = Approval.objects.filter(
        pk=approval.pk,
        state=Approval.State.ISSUED,
        superseded_at__isnull=True,
        expires_at__gt=DbNow(),
    )
    with transaction.atomic():
        delivered = (
            deliverable.filter(token_hash__isnull=True).update(
                token_hash=token_hash,
                fingerprint=fingerprint,
                delivered_at=DbNow(),
                bound_execution_id=execution_id,
            )
            > 0
        )
        previous: Approval | None = None
        if not delivered and execution_id:
            # A re-delivery: the row lock orders two asks of one execution, so each
            # retires exactly the token the other handed out.
            previous = (
                deliverable.select_for_update()
                .filter(bound_execution_id=execution_id, token_hash__isnull=False)
                .first()
            )
            if previous is not None and previous.token_hash:
                RetiredToken.objects.create(
                    approval_id=approval.pk,
                    token_hash=previous.token_hash,
                    fingerprint=previous.fingerprint,
                    retired_at=DbNow(),
                )
                Approval.objects.filter(pk=approval.pk).update(
                    token_hash=token_hash, fingerprint=fingerprint, delivered_at=DbNow()
                )
                delivered = True
        if not delivered:
            _refuse_delivery(approval.pk, execution_id)
        audit_record(
            kind=AuditKind.TOKEN_REDELIVERED if previous is not None else AuditKind.TOKEN_DELIVERED,
            tenant=approval.tenant_id,
            occurrence=approval.occurrence_id,
            actor=runtime_actor(runtime_key),
            token_fingerprint=fingerprint,
            execution_id=execution_id,
            data={"retired_fingerprint": previous.fingerprint} if previous is not None else None,
        )
    _delivered(approval, token_hash=token_hash, fingerprint=fingerprint, execution_id=execution_id)
    return DeliveredToken(token=raw, approval=approval, redelivered=previous is not None)


def _delivered(approval: Approval, *, token_hash: str, fingerprint: str, execution_id: str) -> None:
    """The approval as the delivery left it, without reading it back: the token's hash and
    fingerprint as written; the bound execution is the one asked for (a first delivery
    bound it, a re-delivery found it bound); ``delivered_at`` is the database's clock, so
    it is left unloaded and read from the row if anything asks for it (as a field left out
    by ``only()`` is)."""
    approval.token_hash = token_hash
    approval.fingerprint = fingerprint
    approval.bound_execution_id = execution_id
    del approval.delivered_at


def _refuse_delivery(approval_id: int, execution_id: str) -> NoReturn:
    """Say why the approval's token cannot be handed out (again), from the row as it is."""
    approval = Approval.objects.annotate(db_now=DbNow()).get(pk=approval_id)
    if approval.state == Approval.State.CONSUMED and execution_id:
        command = Command.objects.filter(approval_id=approval.pk).values_list("id", flat=True)
        raise ServiceError(
            ErrorCode.CLAIMED,
            "This approval was already claimed; its command is in details.",
            details={
                "command_id": str(command.first()),
                "execution_id": approval.consumed_by_execution,
            },
        )
    # The same execution asking again is told what stopped the re-delivery (below);
    # anyone else, as in API v1 as first shipped, that the token is gone.
    if approval.token_hash and not (execution_id and approval.bound_execution_id == execution_id):
        raise ServiceError(
            ErrorCode.TOKEN_ALREADY_DELIVERED,
            "The token for this approval was already picked up."
            + (
                " Only the execution it was delivered to may ask for it again."
                if approval.bound_execution_id
                else ""
            ),
        )
    if approval.state == Approval.State.REVOKED:
        raise ServiceError(
            ErrorCode.REVOKED, f"An admin revoked this approval: {approval.revoke_reason}"
        )
    if approval.state == Approval.State.EXPIRED or approval.expires_at <= approval.db_now:  # type: ignore[attr-defined]
        raise ServiceError(
            ErrorCode.EXPIRED, "This approval expired before its token was picked up."
        )
    raise ServiceError(ErrorCode.NOT_APPROVED, "The approved version is no longer current.")
