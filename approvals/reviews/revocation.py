"""Revocation, the kill switch: admins revoke approvals that could still authorize
something, one at a time or in bulk, and are told in words why one cannot be revoked."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from approvals.access.tenancy import User, require_role, username_of
from approvals.audit.record import DbNow, audit_record
from approvals.errors import ErrorCode, InputError, ServiceError
from approvals.models import (
    Approval,
    Command,
    Membership,
    Occurrence,
)
from approvals.vocabulary import (
    AuditKind,
    ClaimDecision,
    ClaimReason,
)


def approval_revoke(*, approval: Approval, admin: User, reason: str) -> bool:
    """An admin revokes one approval. Returns whether it was still revocable; when it was
    not, ``approval_revoke_refusal`` says why in words."""
    require_role(admin, approval.tenant_id, Membership.Role.ADMIN)
    revoked = approvals_revoke(
        approvals=Approval.objects.filter(pk=approval.pk), actor=username_of(admin), reason=reason
    )
    return revoked == 1


def approvals_revoke(
    *, approvals: QuerySet[Approval], actor: str, reason: str, batch: str = ""
) -> int:
    """Revoke every approval in ``approvals`` that could still authorize something (issued,
    not superseded by an edit, not past its expiry); returns how many."""
    return len(approvals_revoke_ids(approvals=approvals, actor=actor, reason=reason, batch=batch))


def approvals_revoke_ids(
    *,
    approvals: QuerySet[Approval],
    actor: str,
    reason: str,
    batch: str = "",
    described: str = "",
) -> list[int]:
    """``approvals_revoke``, returning the ids it revoked. ``batch`` (a bulk revocation's
    id) and ``described`` (its filters in words) go into each ``approval.revoked`` event,
    so the events of one decision can be found together and listed with what chose them."""
    reason = (reason or "").strip()
    if not reason:
        raise InputError("reason_required", "Say why the approvals are revoked.", "reason")
    data = {
        "reason": reason,
        **({"batch": batch, "filter": described} if batch else {}),
    }
    with transaction.atomic():
        targets = list(
            approvals_revocable_of(approvals)
            .select_for_update(of=("self",))
            # One lock order for every revocation, so that two of them never deadlock.
            .order_by("pk")
            .values("pk", "tenant_id", "occurrence_id", "fingerprint")
        )
        if not targets:
            return []
        ids = [t["pk"] for t in targets]
        Approval.objects.filter(pk__in=ids, state=Approval.State.ISSUED).update(
            state=Approval.State.REVOKED, revoked_at=DbNow(), revoked_by=actor, revoke_reason=reason
        )
        Occurrence.objects.filter(
            pk__in=[t["occurrence_id"] for t in targets], status=Occurrence.Status.APPROVED
        ).update(status=Occurrence.Status.REVOKED, updated_at=DbNow())
        for target in targets:
            audit_record(
                kind=AuditKind.APPROVAL_REVOKED,
                tenant=target["tenant_id"],
                occurrence=target["occurrence_id"],
                actor=actor,
                token_fingerprint=target["fingerprint"],
                decision=ClaimDecision.REVOKED,
                reason_code=ClaimReason.REVOKED_BY_ADMIN,
                data=data,
            )
    return ids


def approvals_revoke_by_admin(
    *,
    approvals: QuerySet[Approval],
    admin: User,
    reason: str,
    batch: str = "",
    described: str = "",
) -> list[int]:
    """A bulk revocation from the console: only approvals of tenants where ``admin`` is an
    admin are touched, whatever ``approvals`` holds. Returns the ids revoked."""
    if not admin.is_authenticated:
        raise ServiceError(ErrorCode.FORBIDDEN, "Sign in as an admin of the tenant.", 403)
    admin_of = Membership.objects.filter(user_id=admin.pk, role=Membership.Role.ADMIN).values(
        "tenant_id"
    )
    return approvals_revoke_ids(
        approvals=approvals.filter(tenant_id__in=admin_of),
        actor=username_of(admin),
        reason=reason,
        batch=batch,
        described=described,
    )


def approvals_revocable_of(approvals: QuerySet[Approval]) -> QuerySet[Approval]:
    """Those of ``approvals`` that could still authorize something, judged by the
    database's clock: issued, not superseded by an edit, not past their expiry."""
    return approvals.filter(
        state=Approval.State.ISSUED, superseded_at__isnull=True, expires_at__gt=DbNow()
    )


@dataclass(frozen=True)
class RevocationFilter:
    """What a bulk revocation selects, besides the tenant: the tool, the approver (a
    username), the runtime key that proposed the occurrence, and an issue time (before)."""

    tool: str = ""
    approver: str = ""
    runtime_key_id: int | None = None
    issued_before: datetime | None = None

    def apply(self, approvals: QuerySet[Approval]) -> QuerySet[Approval]:
        if self.tool:
            approvals = approvals.filter(tool_name=self.tool)
        if self.approver:
            approvals = approvals.filter(approver__username=self.approver)
        if self.runtime_key_id is not None:
            approvals = approvals.filter(occurrence__runtime_key_id=self.runtime_key_id)
        if self.issued_before is not None:
            approvals = approvals.filter(issued_at__lt=self.issued_before)
        return approvals


def approvals_revocable(
    *, tenant_ids: list[int], filters: RevocationFilter = RevocationFilter()
) -> QuerySet[Approval]:
    """The approvals of these tenants that ``filters`` selects and that a revocation would
    revoke now (issued, not superseded, not expired): what a preview shows."""
    return approvals_revocable_of(filters.apply(Approval.objects.filter(tenant_id__in=tenant_ids)))


def _utc(moment: datetime | None) -> str:
    return f"{timezone.localtime(moment, UTC):%Y-%m-%d %H:%M:%S} UTC" if moment else "?"


def approval_revoke_refusal(approval: Approval, now: datetime | None = None) -> str:
    """Why ``approval`` cannot be revoked, in words for the person who tried; "" when it
    still can. A consumed approval names its command and the command's effect state:
    revoking stops claims, never a command already admitted, and consumed stays consumed."""
    now = now or timezone.now()
    name = (
        f"Approval {approval.fingerprint}"
        if approval.fingerprint
        else f"The approval of {approval.tool_name} (token not picked up)"
    )
    if approval.state == Approval.State.CONSUMED:
        try:
            # No query when the caller selected it (select_related("command")).
            command: Command | None = approval.command  # type: ignore[attr-defined]
        except Command.DoesNotExist:
            command = None
        used = (
            f"{name} was consumed by execution {approval.consumed_by_execution} at "
            f"{_utc(approval.consumed_at)}"
        )
        if command is None:
            return f"{used}; consumed stays consumed, so it cannot be revoked."
        return (
            f"{used} and became command {command.pk}, whose effect is "
            f"{command.get_state_display().lower()} ({command.state}). Consumed stays "
            "consumed, so it cannot be revoked: revocation stops claims, not a command "
            "already admitted. Its effect is handled in the operations console."
        )
    if approval.state == Approval.State.REVOKED:
        return (
            f"{name} is already revoked, by {approval.revoked_by or 'someone'} at "
            f"{_utc(approval.revoked_at)}: {approval.revoke_reason}"
        )
    if approval.state == Approval.State.EXPIRED or approval.expires_at <= now:
        return f"{name} expired at {_utc(approval.expires_at)} unused; it authorizes nothing."
    if approval.superseded_at is not None:
        return (
            f"{name} was superseded at {_utc(approval.superseded_at)} when its request was "
            "edited; it authorizes nothing."
        )
    return ""
