"""The claim: one conditional UPDATE turns an approval into exactly one command, or the
refusal says precisely why not (``replayed``, ``scope_mismatch``, ``expired``,
``revoked``, ``unknown_token``; ``duplicate_delivery`` for the same execution)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.views.decorators.debug import sensitive_variables

from approvals.access import ratelimit, tokens
from approvals.access.runtime_keys import claimed_by_other_key, runtime_actor
from approvals.audit.record import DbNow, audit_event_new, audit_logged, audit_record
from approvals.canonical.form import canonicalize
from approvals.canonical.schema import validate_arguments
from approvals.claims import sql as claim_sql
from approvals.errors import InputError
from approvals.models import (
    Approval,
    Command,
    Epoch,
    Occurrence,
    RetiredToken,
    RuntimeKey,
    Tenant,
)
from approvals.reviews.selectors import tool_contract
from approvals.vocabulary import (
    AuditKind,
    ClaimDecision,
    ClaimReason,
)


@dataclass(frozen=True)
class ClaimResult:
    decision: str
    reason: str
    command: Command | None = None


# What the guard compares with when the presented action breaks its contract: no SHA-256
# hex digest is "-", so the UPDATE consumes nothing, and the refusal is still explained
# from the approval as it stands (replayed, expired and revoked keep their precedence).
_NO_DIGEST = "-"


def _claimable_digest(tool: str, arguments: Any) -> tuple[str | None, str]:
    """The digest of the presented action, or None if no approval can cover it: the tool
    has no contract, or the arguments break the contract's JSON Schema; and who executes
    the tool (the console when its contract names an adapter, otherwise the runtime).

    Without this, canonical form alone would let ``"amount_minor": 8000.0`` (which RFC 8785
    writes as ``8000``) match an approval of 8000, where the proposal itself would have
    been refused with ``float_not_allowed``.
    """
    contract = tool_contract(tool)
    if contract is None:
        return None, Command.ExecutedBy.RUNTIME
    executed_by = Command.ExecutedBy.CONSOLE if contract.adapter else Command.ExecutedBy.RUNTIME
    try:
        validate_arguments(contract.json_schema, arguments)
        return canonicalize(tool, arguments).digest, executed_by
    except InputError:
        return None, executed_by


@sensitive_variables("token")
def approval_claim(
    *,
    tenant: Tenant,
    token: str,
    tool: str,
    arguments: Any,
    execution_id: str,
    message_id: str = "",
    runtime_key: RuntimeKey | None = None,
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

    With ``runtime_key`` (the API's caller), the audit events name it, a token of a request
    another key proposed (outside the key's runtime group) is refused as ``scope_mismatch``
    with reason ``other_runtime_key`` before the guard runs, and refusals with a token the
    tenant never issued count against the key's audit budget (``approvals.access.ratelimit``).

    The statements themselves are in ``approvals.claims.sql``.
    """
    digest, executed_by = _claimable_digest(tool, arguments)
    token_hash = tokens.hash_secret(token)
    # Which key proposed a request never changes, so this read cannot race the guard: a
    # key outside the proposer's runtime is refused before anything could be consumed.
    other_key = runtime_key is not None and claimed_by_other_key(
        runtime_key, tenant=tenant, token_hash=token_hash
    )

    with transaction.atomic():
        if other_key:
            return _claim_refused(
                tenant=tenant,
                token=token,
                token_hash=token_hash,
                digest=digest,
                tool=tool,
                execution_id=execution_id,
                message_id=message_id,
                runtime_key=runtime_key,
                other_key=True,
            )
        # One statement on PostgreSQL; the ORM, writing the same rows, on SQLite.
        write = (
            _claim_in_one_statement if claim_sql.claim_one_statement() else _claim_through_the_orm
        )
        command = write(
            tenant=tenant,
            token_hash=token_hash,
            digest=digest,
            execution_id=execution_id,
            message_id=message_id,
            runtime_key=runtime_key,
            executed_by=executed_by,
        )
        if command is None:
            return _claim_refused(
                tenant=tenant,
                token=token,
                token_hash=token_hash,
                digest=digest,
                tool=tool,
                execution_id=execution_id,
                message_id=message_id,
                runtime_key=runtime_key,
            )
    # The command row is the outbox: whoever dispatches (``reconciliation.claims``, which
    # sits above this app and calls this function) publishes its delivery once it is
    # committed, and a periodic sweep finds any whose publish got lost.
    return ClaimResult(ClaimDecision.APPROVED, ClaimReason.CLAIMED, command)


def _claim_in_one_statement(
    *,
    tenant: Tenant,
    token_hash: str,
    digest: str | None,
    execution_id: str,
    message_id: str,
    runtime_key: RuntimeKey | None,
    executed_by: str,
) -> Command | None:
    """PostgreSQL: the guard, the epoch, the command, the occurrence's status and the
    audit event in one statement (``approvals.claims.sql.consume_and_write``); the command,
    or None when the guard consumed nothing (and nothing was written)."""
    epoch = Epoch(
        id=uuid.uuid4(), execution_id=execution_id, justification=Epoch.Justification.APPROVAL
    )
    command_id = uuid.uuid4()
    command = Command(
        id=command_id,
        tenant=tenant,
        epoch_id=epoch.id,
        execution_id=execution_id,
        idempotency_key=f"cmd_{command_id.hex}",
        action_digest=digest or _NO_DIGEST,
        executed_by=executed_by,
    )
    event = audit_event_new(
        kind=AuditKind.CLAIM_APPROVED,
        tenant=tenant,
        actor=runtime_actor(runtime_key),
        decision=ClaimDecision.APPROVED,
        reason_code=ClaimReason.CLAIMED,
        execution_id=execution_id,
        message_id=message_id,
        command_id=command_id,
        data={"idempotency_key": command.idempotency_key, "executed_by": executed_by},
    )
    consumed = claim_sql.consume_and_write(
        tenant_id=tenant.pk,
        token_hash=token_hash,
        digest=digest or _NO_DIGEST,
        execution_id=execution_id,
        epoch=epoch,
        command=command,
        event=event,
        occurrence_status=(Occurrence.Status.APPROVED, Occurrence.Status.CLAIMED),
    )
    if consumed is None:
        return None
    # What the statement wrote, as the ORM would have it after saving.
    event.occurrence_id, event.token_fingerprint = consumed.occurrence_id, consumed.fingerprint
    event.data = {"epoch": consumed.epochs + 1, **event.data}
    audit_logged(event)
    fields = [f.attname for f in Command._meta.concrete_fields]
    command.occurrence_id, command.approval_id = consumed.occurrence_id, consumed.approval_id
    return Command.from_db(connection.alias, fields, [getattr(command, name) for name in fields])


def _claim_through_the_orm(
    *,
    tenant: Tenant,
    token_hash: str,
    digest: str | None,
    execution_id: str,
    message_id: str,
    runtime_key: RuntimeKey | None,
    executed_by: str,
) -> Command | None:
    """SQLite: the guard, then the epoch, the command, the occurrence's status and the
    audit event through the ORM, in the caller's transaction; the same rows as
    ``_claim_in_one_statement`` writes."""
    consumed = claim_sql.consume(
        tenant_id=tenant.pk,
        token_hash=token_hash,
        digest=digest or _NO_DIGEST,
        execution_id=execution_id,
    )
    if consumed is None:
        return None
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
        executed_by=executed_by,
    )
    Occurrence.objects.filter(pk=consumed.occurrence_id, status=Occurrence.Status.APPROVED).update(
        status=Occurrence.Status.CLAIMED, updated_at=DbNow()
    )
    audit_record(
        kind=AuditKind.CLAIM_APPROVED,
        tenant=tenant,
        occurrence=consumed.occurrence_id,
        actor=runtime_actor(runtime_key),
        token_fingerprint=consumed.fingerprint,
        decision=ClaimDecision.APPROVED,
        reason_code=ClaimReason.CLAIMED,
        execution_id=execution_id,
        message_id=message_id,
        command_id=command.id,
        data={
            "epoch": epoch.number,
            "idempotency_key": command.idempotency_key,
            "executed_by": executed_by,
        },
    )
    return command


def _explain_refusal(
    approval: claim_sql.FoundApproval, digest: str | None, tool: str, execution_id: str
) -> tuple[ClaimDecision, ClaimReason]:
    """``digest`` is None when the presented action breaks its contract."""
    if approval.state == Approval.State.CONSUMED:
        if approval.consumed_by_execution != execution_id:
            return ClaimDecision.REPLAYED, ClaimReason.CONSUMED_BY_OTHER_EXECUTION
        if digest is None:
            return ClaimDecision.SCOPE_MISMATCH, ClaimReason.ACTION_INVALID
        if approval.action_digest == digest:
            return ClaimDecision.DUPLICATE_DELIVERY, ClaimReason.SAME_EXECUTION_REDELIVERY
        return ClaimDecision.SCOPE_MISMATCH, ClaimReason.ACTION_DIFFERS
    if approval.bound_execution_id and approval.bound_execution_id != execution_id:
        # The token was delivered to another execution: whoever presents it copied it.
        return ClaimDecision.REPLAYED, ClaimReason.BOUND_TO_OTHER_EXECUTION
    if approval.state == Approval.State.REVOKED:
        return ClaimDecision.REVOKED, ClaimReason.REVOKED_BY_ADMIN
    if approval.state == Approval.State.EXPIRED or approval.expired:
        return ClaimDecision.EXPIRED, ClaimReason.EXPIRED
    if approval.superseded:
        return ClaimDecision.SCOPE_MISMATCH, ClaimReason.PROPOSAL_SUPERSEDED
    if digest is None:
        return ClaimDecision.SCOPE_MISMATCH, ClaimReason.ACTION_INVALID
    if approval.tool_name != tool:
        return ClaimDecision.SCOPE_MISMATCH, ClaimReason.TOOL_DIFFERS
    return ClaimDecision.SCOPE_MISMATCH, ClaimReason.ACTION_DIFFERS


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
    runtime_key: RuntimeKey | None = None,
    other_key: bool = False,
) -> ClaimResult:
    """Name the refusal from the approval as the guard left it, and record it.

    ``other_key``: the approval's request was proposed by a key outside ``runtime_key``'s
    runtime (``scope_mismatch``, ``other_runtime_key``; the approval is untouched).

    Every refusal that names a real approval is recorded, one event each: it is the
    evidence of a replay. A refusal with a token the tenant never issued
    (``unknown_token``) is recorded for the first ``API_AUDITED_REFUSALS_PER_WINDOW`` of
    the key's rate-limit window; the rest are counted into the window's one
    ``security.refusals_burst`` event (``approvals.access.ratelimit``). The answer is the same.
    """
    approval = claim_sql.find_approval(tenant_id=tenant.pk, token_hash=token_hash)
    command = None
    retired = None
    if approval is None or not tokens.hashes_match(approval.token_hash or "", token):
        approval = None
        retired = _retired_token(tenant, token_hash, token)
    if retired is not None:
        decision, reason = ClaimDecision.REPLAYED, ClaimReason.TOKEN_REDELIVERED
    elif approval is None:
        decision, reason = ClaimDecision.UNKNOWN_TOKEN, ClaimReason.NO_SUCH_TOKEN
    elif other_key:
        decision, reason = ClaimDecision.SCOPE_MISMATCH, ClaimReason.OTHER_RUNTIME_KEY
    else:
        decision, reason = _explain_refusal(approval, digest, tool, execution_id)
        if decision == ClaimDecision.DUPLICATE_DELIVERY:
            command = Command.objects.get(approval_id=approval.id)
    if (
        decision == ClaimDecision.UNKNOWN_TOKEN
        and runtime_key is not None
        and not ratelimit.unknown_token_refusal_counted(runtime_key)
    ):
        return ClaimResult(decision, reason, command)
    occurrence_id = approval.occurrence_id if approval else None
    fingerprint = approval.fingerprint if approval else tokens.fingerprint(token)
    if retired is not None:
        occurrence_id, fingerprint = retired.approval.occurrence_id, retired.fingerprint
    audit_record(
        kind=AuditKind.for_claim(decision),
        tenant=tenant,
        occurrence=occurrence_id,
        actor=runtime_actor(runtime_key),
        token_fingerprint=fingerprint,
        decision=decision,
        reason_code=reason,
        execution_id=execution_id,
        message_id=message_id,
        command_id=command.id if command else None,
    )
    return ClaimResult(decision, reason, command)


@sensitive_variables("token")
def _retired_token(tenant: Tenant, token_hash: str, token: str) -> RetiredToken | None:
    """The tenant's token that a re-delivery replaced, if ``token`` is one (a refusal-only
    read: a claim that succeeds never gets here)."""
    retired = (
        RetiredToken.objects.select_related("approval")
        .filter(token_hash=token_hash, approval__tenant_id=tenant.pk)
        .first()
    )
    if retired is None or not tokens.hashes_match(retired.token_hash, token):
        return None
    return retired
