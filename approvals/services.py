"""Writes. Every state change is a guarded UPDATE (or runs under a row lock) and writes its
audit event in the same transaction."""

from __future__ import annotations

import hmac
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import structlog
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from approvals import claim_sql, tokens
from approvals.canonical import InputError, canonicalize, validate_arguments
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Command,
    Epoch,
    Membership,
    Occurrence,
    Proposal,
    RuntimeKey,
    Tenant,
    ToolContract,
)

log = structlog.get_logger("approvals")
_stdlib_log = logging.getLogger("approvals")

User = AbstractBaseUser | AnonymousUser


class ServiceError(Exception):
    """A refused state change: a stable code, a message for people, an HTTP status."""

    def __init__(self, code: str, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class DbNow(Now):
    """The database's clock. On PostgreSQL the transaction's start time, so that every
    statement of one claim (the guarded UPDATE and the read that explains a refusal)
    judges expiry against the same instant."""

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="CURRENT_TIMESTAMP", **extra_context)


def db_now() -> datetime:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT CURRENT_TIMESTAMP")
            value: datetime = cursor.fetchone()[0]
            return value
    # SQLite runs in this process: its clock is this process's clock.
    return timezone.now()


# --- audit ----------------------------------------------------------------------------


def audit_record(
    *,
    kind: str,
    tenant: Tenant | int,
    occurrence: Occurrence | uuid.UUID | None = None,
    actor: str = "",
    token_fingerprint: str = "",
    decision: str = "",
    reason_code: str = "",
    execution_id: str = "",
    message_id: str = "",
    command_id: uuid.UUID | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit event. Call it inside the transaction of the change it records."""
    event = AuditEvent.objects.create(
        kind=kind,
        tenant_id=tenant if isinstance(tenant, int) else tenant.pk,
        occurrence_id=occurrence.pk if isinstance(occurrence, Occurrence) else occurrence,
        actor=actor,
        token_fingerprint=token_fingerprint,
        decision=decision,
        reason_code=reason_code,
        execution_id=execution_id,
        message_id=message_id,
        command_id=command_id,
        trace_id=structlog.contextvars.get_contextvars().get("trace_id", ""),
        source_time=timezone.now(),
        data=data or {},
    )
    # Every claim writes one of these lines; when INFO is off, not even the event dict is built.
    if _stdlib_log.isEnabledFor(logging.INFO):
        log.info(
            "audit",
            kind=kind,
            decision=decision,
            reason_code=reason_code,
            fingerprint=token_fingerprint,
            execution_id=execution_id,
            occurrence_id=str(event.occurrence_id or ""),
        )
    return event


# --- tenants, members, keys -------------------------------------------------------------


def has_role(user: User, tenant_id: int, role: str) -> bool:
    if not user.is_authenticated:
        return False
    return Membership.objects.filter(user_id=user.pk, tenant_id=tenant_id, role=role).exists()


def _require_role(user: User, tenant_id: int, role: str) -> None:
    if not has_role(user, tenant_id, role):
        raise ServiceError("forbidden", f"You are not a {role} of this tenant.", 403)


def _username(user: User) -> str:
    return str(user.get_username())


def tenant_create(*, slug: str, name: str = "") -> Tenant:
    return Tenant.objects.create(slug=slug, name=name or slug)


def runtime_key_create(*, tenant: Tenant, name: str) -> tuple[RuntimeKey, str]:
    """Create a runtime key and return it with the raw key, which is never stored."""
    raw = tokens.mint(tokens.RUNTIME_KEY_PREFIX)
    # "rk_" and four random characters: enough to tell keys apart in the admin, while
    # almost all of the key's randomness exists only in the raw key.
    prefix = raw[: len(tokens.RUNTIME_KEY_PREFIX) + 4]
    key = RuntimeKey.objects.create(
        tenant=tenant, name=name, key_hash=tokens.hash_secret(raw), prefix=prefix
    )
    return key, raw


@sensitive_variables("raw")
def runtime_key_authenticate(raw: str) -> RuntimeKey | None:
    key = (
        RuntimeKey.objects.select_related("tenant")
        .filter(key_hash=tokens.hash_secret(raw), is_active=True)
        .first()
    )
    if key is None or not tokens.hashes_match(key.key_hash, raw):
        return None
    return key


# --- proposing --------------------------------------------------------------------------


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
    """Record a proposed tool call. Returns the occurrence and whether it is new.

    A retried proposal with the same ``client_ref`` returns the first occurrence; the same
    ``client_ref`` with a different action is refused, not silently merged.
    """
    tenant = runtime_key.tenant
    contract = ToolContract.objects.filter(name=tool).first()
    if contract is None:
        raise InputError("unknown_tool", f"There is no tool contract named {tool!r}.", "tool")
    validate_arguments(contract.json_schema, arguments)
    action = canonicalize(tool, arguments)

    if client_ref:
        existing = _existing_for_client_ref(tenant, client_ref, action.digest)
        if existing is not None:
            return existing, False

    auto = contract.auto_admit and contract.replay_safety == ToolContract.ReplaySafety.READ_ONLY
    try:
        with transaction.atomic():
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
            )
            Proposal.objects.create(
                occurrence=occurrence,
                version=1,
                canonical_action=action.canonical,
                action_digest=action.digest,
            )
            audit_record(
                kind="occurrence.proposed",
                tenant=tenant,
                occurrence=occurrence,
                actor=f"runtime:{runtime_key.name}",
                data={"tool": tool, "version": 1, "action_digest": action.digest, "run_id": run_id},
            )
            if auto:
                audit_record(
                    kind="occurrence.auto_admitted",
                    tenant=tenant,
                    occurrence=occurrence,
                    actor="policy",
                    decision="auto_admitted",
                    reason_code="policy_read_only",
                    data={"justification": "The tool contract is read-only and auto-admitted."},
                )
    except IntegrityError:
        # Another request with the same client_ref won the insert.
        existing = (
            _existing_for_client_ref(tenant, client_ref, action.digest) if client_ref else None
        )
        if existing is None:
            raise
        return existing, False
    return occurrence, True


def _existing_for_client_ref(tenant: Tenant, client_ref: str, digest: str) -> Occurrence | None:
    existing = Occurrence.objects.filter(tenant=tenant, client_ref=client_ref).first()
    if existing is None:
        return None
    first = existing.proposals.get(version=1)
    if first.action_digest != digest:
        raise ServiceError(
            "client_ref_conflict",
            "This client_ref was already used for a different action.",
            409,
        )
    return existing


# --- reviewing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ApproveOutcome:
    issued: bool
    votes: int
    needed: int
    approval: Approval | None


def _lock_occurrence(occurrence: Occurrence) -> Occurrence:
    return (
        Occurrence.objects.select_for_update(of=("self",))
        .select_related("tool", "tenant")
        .get(pk=occurrence.pk)
    )


def _require_pending(occurrence: Occurrence) -> None:
    if occurrence.status != Occurrence.Status.PENDING_REVIEW:
        raise ServiceError(
            "not_pending",
            "This request is no longer pending review "
            f"(it is {occurrence.get_status_display().lower()}).",
        )


def occurrence_approve(
    *, occurrence: Occurrence, reviewer: User, seen_digest: str
) -> ApproveOutcome:
    """Record the reviewer's approval of the current version; issue the capability once
    the contract's quorum of distinct reviewers is reached.

    Refuses a digest that is not the current version's, a reviewer approving their own
    request or their own edit, a non-reviewer, and anything no longer pending. Concurrent
    approvers are serialized by the occurrence's row lock: exactly one of them issues the
    approval.
    """
    with transaction.atomic():
        occ = _lock_occurrence(occurrence)
        _require_role(reviewer, occ.tenant_id, Membership.Role.REVIEWER)
        username = _username(reviewer)
        if occ.requested_by and occ.requested_by == username:
            raise ServiceError(
                "self_approval",
                "You requested this action, so another reviewer must approve it.",
                403,
            )
        _require_pending(occ)
        proposal = occ.proposals.get(is_current=True)
        if proposal.edited_by_id is not None and proposal.edited_by_id == reviewer.pk:
            # Otherwise one reviewer could rewrite an action and approve it alone.
            raise ServiceError(
                "self_approval",
                "You edited this version, so another reviewer must approve it.",
                403,
            )
        if not hmac.compare_digest(seen_digest.encode(), proposal.action_digest.encode()):
            raise ServiceError(
                "stale_digest",
                "The action changed after you opened it. Review the new version before approving.",
            )
        _, created = ApprovalVote.objects.get_or_create(
            proposal=proposal, reviewer_id=reviewer.pk, defaults={"seen_digest": seen_digest}
        )
        needed = occ.tool.approvals_needed(proposal.arguments)
        votes = proposal.votes.count()
        if created:
            audit_record(
                kind="approval.vote_recorded",
                tenant=occ.tenant_id,
                occurrence=occ,
                actor=username,
                data={"version": proposal.version, "votes": votes, "needed": needed},
            )
        if votes < needed:
            return ApproveOutcome(issued=False, votes=votes, needed=needed, approval=None)

        issued_at = db_now()
        approval = Approval.objects.create(
            tenant_id=occ.tenant_id,
            occurrence=occ,
            proposal=proposal,
            approver_id=cast(int, reviewer.pk),
            tool_name=occ.tool.name,
            action_digest=proposal.action_digest,
            proposal_version=proposal.version,
            issued_at=issued_at,
            expires_at=issued_at + occ.tool.approval_lifetime,
        )
        Occurrence.objects.filter(pk=occ.pk).update(
            status=Occurrence.Status.APPROVED, decided_at=issued_at, updated_at=issued_at
        )
        audit_record(
            kind="approval.issued",
            tenant=occ.tenant_id,
            occurrence=occ,
            actor=username,
            decision="issued",
            data={
                "version": proposal.version,
                "action_digest": proposal.action_digest,
                "expires_at": approval.expires_at.isoformat(),
                "approvers": votes,
            },
        )
    return ApproveOutcome(issued=True, votes=votes, needed=needed, approval=approval)


def occurrence_reject(*, occurrence: Occurrence, reviewer: User, reason: str) -> Occurrence:
    """Reject a pending request. The reason reaches the agent when it asks for its token."""
    reason = (reason or "").strip()
    if not reason:
        raise InputError("reason_required", "Say why you reject this request.", "reason")
    with transaction.atomic():
        occ = _lock_occurrence(occurrence)
        _require_role(reviewer, occ.tenant_id, Membership.Role.REVIEWER)
        _require_pending(occ)
        now = db_now()
        Occurrence.objects.filter(pk=occ.pk).update(
            status=Occurrence.Status.REJECTED,
            rejection_reason=reason,
            decided_at=now,
            updated_at=now,
        )
        audit_record(
            kind="occurrence.rejected",
            tenant=occ.tenant_id,
            occurrence=occ,
            actor=_username(reviewer),
            decision="rejected",
            reason_code="rejected_by_reviewer",
            data={"reason": reason},
        )
    occ.refresh_from_db()
    return occ


def proposal_edit(
    *, occurrence: Occurrence, editor: User, arguments: Any, seen_digest: str
) -> Proposal:
    """Replace the current version's arguments with a new version n+1.

    The old version stays on record; an approval of it is marked superseded, so it can
    never authorize the new version (a claim with it gets ``scope_mismatch``).
    """
    with transaction.atomic():
        # Take the locks in the order a claim and a revocation take them (approval, then
        # occurrence): in the opposite order an edit and a claim of the same approval
        # deadlock, and PostgreSQL aborts one of them.
        list(
            Approval.objects.select_for_update()
            .filter(occurrence_id=occurrence.pk)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        occ = _lock_occurrence(occurrence)
        _require_role(editor, occ.tenant_id, Membership.Role.REVIEWER)
        if occ.status not in {Occurrence.Status.PENDING_REVIEW, Occurrence.Status.APPROVED}:
            raise ServiceError("not_editable", "Only a pending or unclaimed request can be edited.")
        current = occ.proposals.get(is_current=True)
        if not hmac.compare_digest(seen_digest.encode(), current.action_digest.encode()):
            raise ServiceError("stale_digest", "The action changed while you were editing it.")
        validate_arguments(occ.tool.json_schema, arguments)
        action = canonicalize(occ.tool.name, arguments)
        if action.digest == current.action_digest:
            raise InputError("no_change", "The edited action is identical to the current one.")
        now = db_now()
        Proposal.objects.filter(pk=current.pk).update(is_current=False)
        proposal = Proposal.objects.create(
            occurrence=occ,
            version=current.version + 1,
            canonical_action=action.canonical,
            action_digest=action.digest,
            edited_by_id=editor.pk,
        )
        superseded = Approval.objects.filter(
            proposal=current, state=Approval.State.ISSUED, superseded_at__isnull=True
        ).update(superseded_at=now)
        Occurrence.objects.filter(pk=occ.pk).update(
            status=Occurrence.Status.PENDING_REVIEW, decided_at=None, updated_at=now
        )
        audit_record(
            kind="proposal.edited",
            tenant=occ.tenant_id,
            occurrence=occ,
            actor=_username(editor),
            reason_code="approval_superseded" if superseded else "",
            data={
                "from_version": current.version,
                "to_version": proposal.version,
                "from_digest": current.action_digest,
                "to_digest": proposal.action_digest,
            },
        )
    return proposal


# --- the capability ---------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveredToken:
    token: str
    approval: Approval


def _current_approval(occurrence: Occurrence) -> Approval | None:
    return Approval.objects.filter(occurrence=occurrence, proposal__is_current=True).first()


@sensitive_variables("raw")
def approval_deliver_token(*, occurrence: Occurrence) -> DeliveredToken:
    """Mint the approval's token and hand it out exactly once.

    The token exists in memory only for this response; the database keeps its hash.
    """
    approval = _current_approval(occurrence)
    if approval is None:
        if occurrence.status == Occurrence.Status.REJECTED:
            raise ServiceError(
                "rejected", f"A reviewer rejected this request: {occurrence.rejection_reason}"
            )
        if occurrence.status == Occurrence.Status.AUTO_ADMITTED:
            raise ServiceError(
                "auto_admitted", "This call was admitted by policy; it needs no token."
            )
        raise ServiceError("not_approved", "This request has not been approved yet.")

    raw = tokens.mint(tokens.APPROVAL_TOKEN_PREFIX)
    fingerprint = tokens.fingerprint(raw)
    with transaction.atomic():
        delivered = Approval.objects.filter(
            pk=approval.pk,
            state=Approval.State.ISSUED,
            token_hash__isnull=True,
            superseded_at__isnull=True,
            expires_at__gt=DbNow(),
        ).update(token_hash=tokens.hash_secret(raw), fingerprint=fingerprint, delivered_at=DbNow())
        if not delivered:
            approval = Approval.objects.annotate(db_now=DbNow()).get(pk=approval.pk)
            if approval.token_hash:
                raise ServiceError(
                    "token_already_delivered", "The token for this approval was already picked up."
                )
            if approval.state == Approval.State.REVOKED:
                raise ServiceError(
                    "revoked", f"An admin revoked this approval: {approval.revoke_reason}"
                )
            if approval.state == Approval.State.EXPIRED or approval.expires_at <= approval.db_now:  # type: ignore[attr-defined]
                raise ServiceError(
                    "expired", "This approval expired before its token was picked up."
                )
            raise ServiceError("not_approved", "The approved version is no longer current.")
        audit_record(
            kind="token.delivered",
            tenant=approval.tenant_id,
            occurrence=approval.occurrence_id,
            actor="runtime",
            token_fingerprint=fingerprint,
        )
    approval.refresh_from_db()
    return DeliveredToken(token=raw, approval=approval)


class Decision:
    APPROVED = "approved"
    DUPLICATE_DELIVERY = "duplicate_delivery"
    REPLAYED = "replayed"
    SCOPE_MISMATCH = "scope_mismatch"
    EXPIRED = "expired"
    REVOKED = "revoked"
    UNKNOWN_TOKEN = "unknown_token"


@dataclass(frozen=True)
class ClaimResult:
    decision: str
    reason: str
    command: Command | None = None


# What the guard compares with when the presented action breaks its contract: no SHA-256
# hex digest is "-", so the UPDATE consumes nothing, and the refusal is still explained
# from the approval as it stands (replayed, expired and revoked keep their precedence).
_NO_DIGEST = "-"


def _claimable_digest(tool: str, arguments: Any) -> str | None:
    """The digest of the presented action, or None if no approval can cover it: the tool
    has no contract, or the arguments break the contract's JSON Schema.

    Without this, canonical form alone would let ``"amount_minor": 8000.0`` (which RFC 8785
    writes as ``8000``) match an approval of 8000, where the proposal itself would have
    been refused with ``float_not_allowed``.
    """
    schema = ToolContract.objects.filter(name=tool).values_list("json_schema", flat=True).first()
    if schema is None:
        return None
    try:
        validate_arguments(schema, arguments)
        return canonicalize(tool, arguments).digest
    except InputError:
        return None


@sensitive_variables("token")
def approval_claim(
    *,
    tenant: Tenant,
    token: str,
    tool: str,
    arguments: Any,
    execution_id: str,
    message_id: str = "",
) -> ClaimResult:
    """Turn an approval into exactly one command, or say precisely why not.

    One conditional UPDATE decides; the row it returns is the only thing that admits a
    claim. The epoch, the command, the occurrence's status and the audit event are written
    in the same transaction. A refusal reads the approval once, after the UPDATE, to name
    the decision, and leaves it as it was.

    The presented arguments are checked against the tool contract first, as a proposal's
    are: an action that breaks the contract (an unknown tool, a float where the schema
    wants an integer) can match no approval and is refused as ``scope_mismatch`` with
    reason ``action_invalid``.

    The statements themselves are in ``approvals.claim_sql``.
    """
    digest = _claimable_digest(tool, arguments)
    token_hash = tokens.hash_secret(token)

    with transaction.atomic():
        consumed = claim_sql.consume(
            tenant_id=tenant.pk,
            token_hash=token_hash,
            digest=digest or _NO_DIGEST,
            execution_id=execution_id,
        )
        if consumed is None:
            return _claim_refused(
                tenant=tenant,
                token=token,
                token_hash=token_hash,
                digest=digest,
                tool=tool,
                execution_id=execution_id,
                message_id=message_id,
            )
        assert digest is not None  # _NO_DIGEST matches no approval
        epoch = Epoch.objects.create(
            occurrence_id=consumed.occurrence_id,
            number=consumed.epochs + 1,
            execution_id=execution_id,
            justification=Epoch.Justification.APPROVAL,
        )
        command_id = uuid.uuid4()
        command = Command.objects.create(
            id=command_id,
            tenant=tenant,
            occurrence_id=consumed.occurrence_id,
            approval_id=consumed.approval_id,
            epoch=epoch,
            execution_id=execution_id,
            idempotency_key=f"cmd_{command_id.hex}",
            action_digest=digest,
        )
        Occurrence.objects.filter(
            pk=consumed.occurrence_id, status=Occurrence.Status.APPROVED
        ).update(status=Occurrence.Status.CLAIMED, updated_at=DbNow())
        audit_record(
            kind="claim.approved",
            tenant=tenant,
            occurrence=consumed.occurrence_id,
            actor="runtime",
            token_fingerprint=consumed.fingerprint,
            decision=Decision.APPROVED,
            reason_code="claimed",
            execution_id=execution_id,
            message_id=message_id,
            command_id=command.id,
            data={"epoch": epoch.number, "idempotency_key": command.idempotency_key},
        )
    return ClaimResult(Decision.APPROVED, "claimed", command)


def _explain_refusal(
    approval: claim_sql.FoundApproval, digest: str | None, tool: str, execution_id: str
) -> tuple[str, str]:
    """``digest`` is None when the presented action breaks its contract."""
    if approval.state == Approval.State.CONSUMED:
        if approval.consumed_by_execution != execution_id:
            return Decision.REPLAYED, "consumed_by_other_execution"
        if digest is None:
            return Decision.SCOPE_MISMATCH, "action_invalid"
        if approval.action_digest == digest:
            return Decision.DUPLICATE_DELIVERY, "same_execution_redelivery"
        return Decision.SCOPE_MISMATCH, "action_differs"
    if approval.state == Approval.State.REVOKED:
        return Decision.REVOKED, "revoked_by_admin"
    if approval.state == Approval.State.EXPIRED or approval.expired:
        return Decision.EXPIRED, "expired"
    if approval.superseded:
        return Decision.SCOPE_MISMATCH, "proposal_superseded"
    if digest is None:
        return Decision.SCOPE_MISMATCH, "action_invalid"
    if approval.tool_name != tool:
        return Decision.SCOPE_MISMATCH, "tool_differs"
    return Decision.SCOPE_MISMATCH, "action_differs"


@sensitive_variables("token")
def _claim_refused(
    *,
    tenant: Tenant,
    token: str,
    token_hash: str,
    digest: str | None,
    tool: str,
    execution_id: str,
    message_id: str,
) -> ClaimResult:
    """Name the refusal from the approval as the guard left it, and record it."""
    approval = claim_sql.find_approval(tenant_id=tenant.pk, token_hash=token_hash)
    command = None
    if approval is None or not tokens.hashes_match(approval.token_hash or "", token):
        approval = None
        decision, reason = Decision.UNKNOWN_TOKEN, "no_such_token"
    else:
        decision, reason = _explain_refusal(approval, digest, tool, execution_id)
        if decision == Decision.DUPLICATE_DELIVERY:
            command = Command.objects.get(approval_id=approval.id)
    audit_record(
        kind=f"claim.{decision}",
        tenant=tenant,
        occurrence=approval.occurrence_id if approval else None,
        actor="runtime",
        token_fingerprint=approval.fingerprint if approval else tokens.fingerprint(token),
        decision=decision,
        reason_code=reason,
        execution_id=execution_id,
        message_id=message_id,
        command_id=command.id if command else None,
    )
    return ClaimResult(decision, reason, command)


# --- revocation (the kill switch) -------------------------------------------------------


def approval_revoke(*, approval: Approval, admin: User, reason: str) -> bool:
    """An admin revokes one approval. Returns whether it was still revocable."""
    _require_role(admin, approval.tenant_id, Membership.Role.ADMIN)
    revoked = approvals_revoke(
        approvals=Approval.objects.filter(pk=approval.pk), actor=_username(admin), reason=reason
    )
    return revoked == 1


def approvals_revoke(*, approvals: QuerySet[Approval], actor: str, reason: str) -> int:
    """Revoke every approval in ``approvals`` that could still authorize something (issued,
    not superseded by an edit, not past its expiry); returns how many."""
    reason = (reason or "").strip()
    if not reason:
        raise InputError("reason_required", "Say why the approvals are revoked.", "reason")
    with transaction.atomic():
        targets = list(
            approvals.filter(
                state=Approval.State.ISSUED, superseded_at__isnull=True, expires_at__gt=DbNow()
            )
            .select_for_update(of=("self",))
            # One lock order for every revocation, so that two of them never deadlock.
            .order_by("pk")
            .values("pk", "tenant_id", "occurrence_id", "fingerprint")
        )
        if not targets:
            return 0
        ids = [t["pk"] for t in targets]
        revoked = Approval.objects.filter(pk__in=ids, state=Approval.State.ISSUED).update(
            state=Approval.State.REVOKED, revoked_at=DbNow(), revoked_by=actor, revoke_reason=reason
        )
        Occurrence.objects.filter(
            pk__in=[t["occurrence_id"] for t in targets], status=Occurrence.Status.APPROVED
        ).update(status=Occurrence.Status.REVOKED, updated_at=DbNow())
        for target in targets:
            audit_record(
                kind="approval.revoked",
                tenant=target["tenant_id"],
                occurrence=target["occurrence_id"],
                actor=actor,
                token_fingerprint=target["fingerprint"],
                decision="revoked",
                reason_code="revoked_by_admin",
                data={"reason": reason},
            )
    return revoked
