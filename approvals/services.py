"""Writes. Every state change is a guarded UPDATE (or runs under a row lock) and writes its
audit event in the same transaction."""

from __future__ import annotations

import functools
import hmac
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, cast

import structlog
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from approvals import callbacks, claim_sql, keycache, ratelimit, selectors, signals, tokens
from approvals.canonical.form import CanonicalAction, canonicalize
from approvals.canonical.schema import validate_arguments
from approvals.errors import InputError
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditChainHead,
    AuditDuplicateDelivery,
    AuditEvent,
    AuditIngestion,
    Command,
    Epoch,
    Membership,
    Occurrence,
    Proposal,
    RetiredToken,
    RuntimeKey,
    Tenant,
    ToolContract,
)
from approvals.vocabulary import (
    AuditKind,
    ClaimDecision,
    ClaimReason,
    EventDecision,
    EventReason,
)

log = structlog.get_logger("approvals")
_stdlib_log = logging.getLogger("approvals")

User = AbstractBaseUser | AnonymousUser


class ServiceError(Exception):
    """A refused state change: a stable code, a message for people, an HTTP status, and
    ``details``: the refusal's facts as fields (a rejection's ``reason``), for programs."""

    def __init__(
        self, code: str, message: str, status: int = 409, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.details = details


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
    if kind in callbacks.EVENTS:
        # A decision the proposing runtime may have asked to be told of: its push is
        # written in this transaction (an outbox row), sent after commit.
        callbacks.delivery_create(event)
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


# --- the audit chain ----------------------------------------------------------------------

# Events chained per transaction: the chain head's row lock is held for one batch at most.
AUDIT_CHAIN_BATCH = 1000


def audit_chain_extend(*, tenant_id: int, limit: int | None = None) -> int:
    """Chain the tenant's audit events that are not chained yet, in id order, and return
    the event id through which the tenant's chain is complete (``chained_through``).

    Runs off the claim's hot path: the beat task calls it every few seconds, and so do the
    export (before it answers) and ``verify_audit_chain``. Each batch is one short
    transaction under the row lock of the tenant's ``AuditChainHead``, so concurrent
    callers wait for each other and can never give out one ``chain_seq`` twice. Only ids
    up to ``selectors.audit_watermark()`` are chained: every lower id has committed or
    never will, so the chain's order is the ids' order and a late-committing event is
    never passed over. ``limit`` bounds the events one call chains (an export must answer
    quickly; the beat task chains the rest)."""
    chained = 0
    while True:
        size = AUDIT_CHAIN_BATCH if limit is None else min(AUDIT_CHAIN_BATCH, limit - chained)
        done, through, complete = _audit_chain_batch(tenant_id=tenant_id, size=max(size, 0))
        chained += done
        if complete or (limit is not None and chained >= limit):
            return through


def _audit_chain_batch(*, tenant_id: int, size: int) -> tuple[int, int, bool]:
    with transaction.atomic():
        AuditChainHead.objects.bulk_create(
            [AuditChainHead(tenant_id=tenant_id)], ignore_conflicts=True
        )
        head = AuditChainHead.objects.select_for_update().get(tenant_id=tenant_id)
        settled = selectors.audit_watermark()
        events = list(
            AuditEvent.objects.filter(
                tenant_id=tenant_id,
                chain_seq__isnull=True,
                id__gt=head.chained_through,
                id__lte=settled,
            ).order_by("id")[:size]
        )
        seq, prev_hash = head.seq, head.hash
        links = []
        for event in events:
            seq += 1
            digest = event.chain_hash(chain_seq=seq, prev_hash=prev_hash)
            links.append((event.pk, seq, digest, prev_hash))
            prev_hash = digest
        _audit_chain_write(links)
        complete = len(events) < size
        # Complete: every settled id is chained. Otherwise: up to the last one chained.
        last = events[-1].pk if events else head.chained_through
        through = settled if complete else last
        # Never backwards: a caller whose own transaction is writing audit events sees a
        # higher watermark than the others (its own events are visible to it).
        through = max(head.chained_through, through)
        if links or through != head.chained_through:
            head.seq, head.hash, head.chained_through = seq, prev_hash, through
            head.save(update_fields=["seq", "hash", "chained_through", "updated_at"])
    return len(events), through, complete


def _audit_chain_write(links: list[tuple[int, int, str, str]]) -> None:
    """Set the chain columns: the one UPDATE the append-only trigger allows, once."""
    if not links:
        return
    table = AuditEvent._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            ids, seqs, hashes, prev_hashes = (list(column) for column in zip(*links, strict=True))
            cursor.execute(
                f"""UPDATE {table} AS e
                       SET chain_seq = v.seq, hash = v.hash, prev_hash = v.prev_hash
                      FROM unnest(%s::bigint[], %s::bigint[], %s::varchar[], %s::varchar[])
                           AS v(id, seq, hash, prev_hash)
                     WHERE e.id = v.id AND e.chain_seq IS NULL""",  # noqa: S608 (table name)
                [ids, seqs, hashes, prev_hashes],
            )
            updated = cursor.rowcount
        else:
            cursor.executemany(
                f"UPDATE {table} SET chain_seq = %s, hash = %s, prev_hash = %s"  # noqa: S608
                " WHERE id = %s AND chain_seq IS NULL",
                [(seq, digest, prev, pk) for pk, seq, digest, prev in links],
            )
            updated = len(links)
    if updated != len(links):
        raise RuntimeError(f"chained {updated} of {len(links)} audit events")


# --- audit ingestion --------------------------------------------------------------------

# Batches of one tenant are ingested one at a time: an advisory lock (this class, the
# tenant's id) so that two batches carrying one producer event cannot both store it.
_AUDIT_INGEST_LOCK = 0x61756469


@dataclass(frozen=True)
class AuditLine:
    """One producer event of an ingested batch, its shape already checked (``api``)."""

    line: int
    event_id: uuid.UUID
    kind: str
    token_fingerprint: str
    decision: str
    execution_id: str
    message_id: str
    command_id: uuid.UUID | None
    source_time: datetime
    reason_code: str
    occurrence_id: uuid.UUID | None
    payload: dict[str, Any]

    def says(self) -> tuple[Any, ...]:
        return (
            self.kind,
            self.token_fingerprint,
            self.decision,
            self.execution_id,
            self.message_id,
            self.command_id,
            self.source_time,
            self.reason_code,
            self.occurrence_id,
        )


def _event_says(event: AuditEvent) -> tuple[Any, ...]:
    return (
        event.kind,
        event.token_fingerprint,
        event.decision,
        event.execution_id,
        event.message_id,
        event.command_id,
        event.source_time,
        event.reason_code,
        event.occurrence_id,
    )


def audit_ingest(*, runtime_key: RuntimeKey, lines: list[AuditLine]) -> AuditIngestion:
    """Store a batch of other producers' audit events for the key's tenant, all or nothing.

    A producer event id stored before for the tenant (by an earlier batch, an earlier line
    of this one, or the console itself) is not stored again: the line becomes an
    ``AuditDuplicateDelivery`` of the stored event, with this ingestion's id and time. An
    ``occurrence_id`` must name an occurrence of the tenant; otherwise nothing is written
    and the ``InputError`` names every such line."""
    tenant_id = runtime_key.tenant_id
    with transaction.atomic():
        named = {line.occurrence_id for line in lines if line.occurrence_id is not None}
        known = set(
            Occurrence.objects.filter(tenant_id=tenant_id, pk__in=named).values_list(
                "pk", flat=True
            )
        )
        unknown = [line for line in lines if line.occurrence_id not in (None, *known)]
        if unknown:
            details = [
                {
                    "line": line.line,
                    "field": "occurrence_id",
                    "code": "unknown_occurrence",
                    "message": "No such occurrence for this runtime key's tenant.",
                }
                for line in unknown
            ]
            raise InputError(
                "unknown_occurrence",
                f"line {unknown[0].line}: occurrence_id names no occurrence of this tenant.",
                details=details,
            )
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, %s)", [_AUDIT_INGEST_LOCK, tenant_id]
                )
        stored: dict[uuid.UUID, AuditEvent] = {}
        earlier = AuditEvent.objects.filter(
            tenant_id=tenant_id, event_id__in={line.event_id for line in lines}
        ).order_by("id")
        for event in earlier:
            stored.setdefault(event.event_id, event)
        fresh: list[AuditLine] = []
        repeated: list[AuditLine] = []
        seen = set(stored)
        for line in lines:
            if line.event_id in seen:
                repeated.append(line)
            else:
                seen.add(line.event_id)
                fresh.append(line)
        ingestion = AuditIngestion.objects.create(
            tenant_id=tenant_id,
            runtime_key=runtime_key,
            received=len(lines),
            new=len(fresh),
            duplicates=len(repeated),
            trace_id=structlog.contextvars.get_contextvars().get("trace_id", ""),
        )
        events = AuditEvent.objects.bulk_create(
            [
                AuditEvent(
                    event_id=line.event_id,
                    kind=line.kind,
                    tenant_id=tenant_id,
                    occurrence_id=line.occurrence_id,
                    token_fingerprint=line.token_fingerprint,
                    decision=line.decision,
                    reason_code=line.reason_code,
                    execution_id=line.execution_id,
                    message_id=line.message_id,
                    command_id=line.command_id,
                    trace_id=ingestion.trace_id,
                    source_time=line.source_time,
                    ingestion=ingestion,
                )
                for line in fresh
            ],
            batch_size=500,
        )
        stored.update((event.event_id, event) for event in events)
        AuditDuplicateDelivery.objects.bulk_create(
            [
                AuditDuplicateDelivery(
                    tenant_id=tenant_id,
                    ingestion=ingestion,
                    original=stored[line.event_id],
                    event_id=line.event_id,
                    line=line.line,
                    payload=line.payload,
                    same_payload=line.says() == _event_says(stored[line.event_id]),
                )
                for line in repeated
            ],
            batch_size=500,
        )
    if _stdlib_log.isEnabledFor(logging.INFO):
        log.info(
            "audit.ingested",
            ingestion_id=ingestion.pk,
            received=ingestion.received,
            new=ingestion.new,
            duplicates=ingestion.duplicates,
        )
    return ingestion


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


# ``last_used_at`` is kept to this precision: a key in steady use costs one UPDATE a minute.
RUNTIME_KEY_LAST_USED_PRECISION = timedelta(minutes=1)


@sensitive_variables("raw")
def runtime_key_authenticate(raw: str) -> RuntimeKey | None:
    """The active key ``raw`` names, with its tenant, or None. Read from the database at
    most once a second per process (``approvals.keycache``): a deactivated key is refused
    within a second everywhere, at once by the process that deactivated it."""
    key_hash = tokens.hash_secret(raw)
    key = keycache.get(key_hash)
    if key is None:
        read_at = keycache.now()
        key = (
            RuntimeKey.objects.select_related("tenant")
            .filter(key_hash=key_hash, is_active=True)
            .first()
        )
        if key is None:
            return None
        keycache.put(key_hash, key, read_at=read_at)
    if not tokens.hashes_match(key.key_hash, raw):
        return None
    now = timezone.now()
    stale = now - RUNTIME_KEY_LAST_USED_PRECISION
    if key.last_used_at is None or key.last_used_at < stale:
        # Guarded: of concurrent requests, one writes; none waits for another's row lock
        # longer than this one statement, and a fresh value is never written again.
        RuntimeKey.objects.filter(pk=key.pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale)
        ).update(last_used_at=now)
        key.last_used_at = now
        keycache.touch(key_hash, now)
    return key


def runtime_key_issue(*, tenant: Tenant, name: str, admin: User) -> tuple[RuntimeKey, str]:
    """An admin creates a runtime key in the console: ``runtime_key_create`` with the role
    checked, the name checked, and ``runtime_key.created`` recorded (never the key)."""
    _require_role(admin, tenant.pk, Membership.Role.ADMIN)
    name = (name or "").strip()
    if not name:
        raise InputError("name_required", "Give the key a name.", "name")
    if len(name) > RuntimeKey._meta.get_field("name").max_length:  # type: ignore[operator]
        raise InputError("name_too_long", "Keep the name under 100 characters.", "name")
    try:
        with transaction.atomic():
            key, raw = runtime_key_create(tenant=tenant, name=name)
            audit_record(
                kind=AuditKind.RUNTIME_KEY_CREATED,
                tenant=tenant,
                actor=_username(admin),
                data={"key_id": key.pk, "name": key.name, "prefix": key.prefix},
            )
    except IntegrityError:
        raise InputError(
            "name_taken", f"{tenant.name} already has a runtime key named {name!r}.", "name"
        ) from None
    return key, raw


def runtime_key_deactivate(*, key: RuntimeKey, admin: User) -> bool:
    """An admin deactivates a runtime key: from the next request on, the API answers it
    401. Returns whether it was active (a guarded UPDATE: of two admins, one records it)."""
    _require_role(admin, key.tenant_id, Membership.Role.ADMIN)
    with transaction.atomic():
        changed = RuntimeKey.objects.filter(pk=key.pk, is_active=True).update(is_active=False)
        # This process refuses the key from now on; the others within a second (keycache).
        transaction.on_commit(functools.partial(keycache.forget, key.pk))
        if changed:
            audit_record(
                kind=AuditKind.RUNTIME_KEY_DEACTIVATED,
                tenant=key.tenant_id,
                actor=_username(admin),
                decision=EventDecision.DEACTIVATED,
                data={"key_id": key.pk, "name": key.name, "prefix": key.prefix},
            )
    return bool(changed)


# --- proposing --------------------------------------------------------------------------


def action_canonical(tool: str, arguments: Any) -> tuple[ToolContract, CanonicalAction]:
    """The tool's contract and the action's canonical form and digest, or the InputError a
    proposal of it gets (unknown tool, arguments outside the contract). Writes nothing."""
    contract = ToolContract.objects.filter(name=tool).first()
    if contract is None:
        raise InputError("unknown_tool", f"There is no tool contract named {tool!r}.", "tool")
    validate_arguments(contract.json_schema, arguments)
    return contract, canonicalize(tool, arguments)


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

    A retried proposal with the same ``client_ref`` in the same run returns the first
    occurrence; the same ``client_ref`` with a different action is refused, not silently
    merged. Another run may use the same ``client_ref`` (frameworks reuse tool-call ids).

    When the contract sets ``reject_repeats`` and a reviewer already rejected this action
    (same digest) in the same run, the new occurrence is rejected at once by policy, with
    the original reason (audited as ``occurrence.rejected``, reason ``repeat_of_rejected``).
    """
    tenant = runtime_key.tenant
    contract, action = action_canonical(tool, arguments)

    if client_ref:
        existing = _existing_for_client_ref(tenant, run_id, client_ref, action.digest)
        if existing is not None:
            return existing, False

    auto = contract.auto_admit and contract.replay_safety == ToolContract.ReplaySafety.READ_ONLY
    repeat_of = None
    if contract.reject_repeats and not auto:
        prior = selectors.prior_rejections(
            tenant=tenant, run_id=run_id, action_digest=action.digest, limit=1
        )
        repeat_of = prior[0] if prior else None
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
                kind=AuditKind.OCCURRENCE_PROPOSED,
                tenant=tenant,
                occurrence=occurrence,
                actor=f"runtime:{runtime_key.name}",
                data={"tool": tool, "version": 1, "action_digest": action.digest, "run_id": run_id},
            )
            if auto:
                audit_record(
                    kind=AuditKind.OCCURRENCE_AUTO_ADMITTED,
                    tenant=tenant,
                    occurrence=occurrence,
                    actor="policy",
                    decision=EventDecision.AUTO_ADMITTED,
                    reason_code=EventReason.POLICY_READ_ONLY,
                    data={"justification": "The tool contract is read-only and auto-admitted."},
                )
            if repeat_of is not None:
                _reject_repeat(occurrence, repeat_of)
    except IntegrityError:
        # Another request with the same client_ref won the insert.
        existing = (
            _existing_for_client_ref(tenant, run_id, client_ref, action.digest)
            if client_ref
            else None
        )
        if existing is None:
            raise
        return existing, False
    return occurrence, True


def _reject_repeat(occurrence: Occurrence, repeat_of: selectors.PriorDecision) -> None:
    """Reject a new occurrence by policy: it repeats an action rejected in its run."""
    now = db_now()
    Occurrence.objects.filter(pk=occurrence.pk).update(
        status=Occurrence.Status.REJECTED,
        rejection_reason=repeat_of.reason,
        decided_at=now,
        updated_at=now,
    )
    occurrence.refresh_from_db()
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
            "client_ref_conflict",
            "This client_ref was already used in this run for a different action.",
            409,
            details={"occurrence_id": str(existing.pk)},
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


def _lock_approvals_then_occurrence(occurrence: Occurrence) -> Occurrence:
    """Lock the occurrence's approvals, then the occurrence: the order a claim and a
    revocation take them. In the opposite order a change of the occurrence (an edit, a
    renewal) and a claim of its approval deadlock, and PostgreSQL aborts one of them."""
    list(
        Approval.objects.select_for_update()
        .filter(occurrence_id=occurrence.pk)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    return _lock_occurrence(occurrence)


def _require_pending(occurrence: Occurrence) -> None:
    if occurrence.status != Occurrence.Status.PENDING_REVIEW:
        raise ServiceError(
            "not_pending",
            "This request is no longer pending review "
            f"(it is {occurrence.get_status_display().lower()}).",
        )


def occurrence_approve(
    *, occurrence: Occurrence, reviewer: User, seen_digest: str, via: str = ""
) -> ApproveOutcome:
    """Record the reviewer's approval of the current version; issue the capability once
    the contract's quorum of distinct reviewers is reached. ``via`` names a personal access
    token the decision came through (``approvals.reviewer_tokens``), in the audit events.

    Refuses a digest that is not the current version's, a reviewer approving their own
    request or their own edit, a non-reviewer, and anything no longer pending. Concurrent
    approvers are serialized by the occurrence's row lock: exactly one of them issues the
    approval.
    """
    with transaction.atomic():
        occ = _lock_occurrence(occurrence)
        _require_role(reviewer, occ.tenant_id, Membership.Role.REVIEWER)
        username = _username(reviewer)
        # requested_by is agent-supplied: "Rita", "rita ", "rita\u200b" and rita's email
        # address all name rita (canonical.identity_key), so none of them lets her approve.
        from approvals.canonical.confusables import same_person

        if same_person(occ.requested_by, username, getattr(reviewer, "email", "") or ""):
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
                kind=AuditKind.APPROVAL_VOTE_RECORDED,
                tenant=occ.tenant_id,
                occurrence=occ,
                actor=username,
                data={
                    "version": proposal.version,
                    "votes": votes,
                    "needed": needed,
                    **({"via": via} if via else {}),
                },
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
            kind=AuditKind.APPROVAL_ISSUED,
            tenant=occ.tenant_id,
            occurrence=occ,
            actor=username,
            decision=EventDecision.ISSUED,
            data={
                "version": proposal.version,
                "action_digest": proposal.action_digest,
                "expires_at": approval.expires_at.isoformat(),
                "approvers": votes,
                **({"via": via} if via else {}),
            },
        )
    return ApproveOutcome(issued=True, votes=votes, needed=needed, approval=approval)


def occurrence_reject(
    *, occurrence: Occurrence, reviewer: User, reason: str, via: str = ""
) -> Occurrence:
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
            kind=AuditKind.OCCURRENCE_REJECTED,
            tenant=occ.tenant_id,
            occurrence=occ,
            actor=_username(reviewer),
            decision=EventDecision.REJECTED,
            reason_code=EventReason.REJECTED_BY_REVIEWER,
            data={"reason": reason, **({"via": via} if via else {})},
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
        occ = _lock_approvals_then_occurrence(occurrence)
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
            kind=AuditKind.PROPOSAL_EDITED,
            tenant=occ.tenant_id,
            occurrence=occ,
            actor=_username(editor),
            reason_code=EventReason.APPROVAL_SUPERSEDED if superseded else "",
            data={
                "from_version": current.version,
                "to_version": proposal.version,
                "from_digest": current.action_digest,
                "to_digest": proposal.action_digest,
            },
        )
    return proposal


def rejection_details(occurrence: Occurrence) -> dict[str, Any]:
    """A rejection's facts as fields, for an error's ``details``."""
    decided_at = occurrence.decided_at
    return {
        "reason": occurrence.rejection_reason,
        "rejected_at": decided_at.isoformat() if decided_at else None,
    }


def _renew_refusal(occurrence: Occurrence, approval: Approval | None, now: datetime) -> None:
    """Raise the 409 that says why this occurrence cannot be renewed, if it cannot."""
    status = occurrence.status
    details: dict[str, Any] = {"status": status}
    if status == Occurrence.Status.REJECTED:
        raise ServiceError(
            "rejected",
            f"A reviewer rejected this request: {occurrence.rejection_reason}",
            details={**details, **rejection_details(occurrence)},
        )
    if status == Occurrence.Status.PENDING_REVIEW:
        raise ServiceError(
            "pending_review", "This request is already waiting for review.", details=details
        )
    if status == Occurrence.Status.AUTO_ADMITTED:
        raise ServiceError(
            "auto_admitted",
            "This call was admitted by policy; it has no approval.",
            details=details,
        )
    if status == Occurrence.Status.CLAIMED or (
        approval is not None and approval.state == Approval.State.CONSUMED
    ):
        raise ServiceError(
            "claimed", "This approval was claimed; it cannot be renewed.", details=details
        )
    if status == Occurrence.Status.REVOKED or (
        approval is not None and approval.state == Approval.State.REVOKED
    ):
        raise ServiceError(
            "revoked", "An admin revoked this approval; it cannot be renewed.", details=details
        )
    expired = approval is not None and (
        approval.state == Approval.State.EXPIRED
        or (approval.state == Approval.State.ISSUED and approval.expires_at <= now)
    )
    if not expired:
        raise ServiceError(
            "not_expired",
            "This approval has not expired; pick up its token or claim it.",
            details={
                **details,
                "expires_at": approval.expires_at.isoformat() if approval else None,
            },
        )


def occurrence_renew(*, occurrence: Occurrence, actor: str) -> Proposal:
    """Send an occurrence whose approval expired unclaimed back to review.

    Nothing revives the expired approval: it stays on record, expired, bound to its version
    ``n``. The occurrence gets a new version ``n+1`` with the same canonical action (and
    digest), not edited by anyone, and becomes ``pending_review``. A new version is what
    makes the review fresh: votes and approvals belong to a version (one vote per reviewer
    and one approval per version), so the old version's votes do not count again, and the
    old approval (marked superseded) can never authorize the new one.

    Only an expired, unclaimed approval can be renewed: one past ``expires_at`` counts as
    expired even before the sweep writes it down (and is written down here). Anything else
    is refused with a 409 naming the state: ``pending_review``, ``not_expired``,
    ``claimed``, ``rejected``, ``revoked``, ``auto_admitted``.
    """
    with transaction.atomic():
        occ = _lock_approvals_then_occurrence(occurrence)
        now = db_now()
        current = occ.proposals.get(is_current=True)
        approval = Approval.objects.filter(proposal=current).first()
        _renew_refusal(occ, approval, now)
        assert approval is not None  # _renew_refusal refuses an occurrence without one
        written_down = Approval.objects.filter(pk=approval.pk, state=Approval.State.ISSUED).update(
            state=Approval.State.EXPIRED
        )
        if written_down:
            # What the sweep would have written: the same event, before the renewal.
            audit_record(
                kind=AuditKind.APPROVAL_EXPIRED,
                tenant=occ.tenant_id,
                occurrence=occ,
                actor="clock",
                token_fingerprint=approval.fingerprint,
                decision=ClaimDecision.EXPIRED,
                reason_code=EventReason.EXPIRED_UNCLAIMED,
                data={"expires_at": approval.expires_at.isoformat()},
            )
        Approval.objects.filter(pk=approval.pk, superseded_at__isnull=True).update(
            superseded_at=now
        )
        Proposal.objects.filter(pk=current.pk).update(is_current=False)
        proposal = Proposal.objects.create(
            occurrence=occ,
            version=current.version + 1,
            canonical_action=current.canonical_action,
            action_digest=current.action_digest,
            edited_by=None,
        )
        Occurrence.objects.filter(pk=occ.pk).update(
            status=Occurrence.Status.PENDING_REVIEW, decided_at=None, updated_at=now
        )
        audit_record(
            kind=AuditKind.OCCURRENCE_RENEWED,
            tenant=occ.tenant_id,
            occurrence=occ,
            actor=actor,
            token_fingerprint=approval.fingerprint,
            reason_code=EventReason.APPROVAL_EXPIRED,
            data={
                "from_version": current.version,
                "to_version": proposal.version,
                "action_digest": proposal.action_digest,
                "expires_at": approval.expires_at.isoformat(),
            },
        )
    return proposal


# --- the capability ---------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveredToken:
    token: str
    approval: Approval
    redelivered: bool = False  # a fresh token for the execution the approval is bound to


def _current_approval(occurrence: Occurrence) -> Approval | None:
    return Approval.objects.filter(occurrence=occurrence, proposal__is_current=True).first()


def _runtime_actor(runtime_key: RuntimeKey | None) -> str:
    """The audit actor of a runtime's step: ``runtime:<key name>``; bare ``runtime`` only
    for a caller inside the console that has no key (tests, benchmarks)."""
    return runtime_key.actor if runtime_key is not None else "runtime"


def runtime_key_may_act_for(runtime_key: RuntimeKey, proposer_key_id: int | None) -> bool:
    """Whether ``runtime_key`` may pick up and claim a request proposed by the key
    ``proposer_key_id``: it is that key, or both are in the same non-empty runtime group
    of the tenant (an admin's grant). A request with no proposing key on record is the
    tenant's."""
    if proposer_key_id is None or proposer_key_id == runtime_key.pk:
        return True
    if not runtime_key.runtime_group:
        return False
    return RuntimeKey.objects.filter(
        pk=proposer_key_id,
        tenant_id=runtime_key.tenant_id,
        runtime_group=runtime_key.runtime_group,
    ).exists()


def _claimed_by_other_key(runtime_key: RuntimeKey, *, tenant: Tenant, token_hash: str) -> bool:
    """Whether the tenant's approval with this token hash belongs to a request that
    ``runtime_key`` may not claim (one read; False when there is no such approval)."""
    found = (
        Approval.objects.filter(tenant_id=tenant.pk, token_hash=token_hash)
        .values_list("occurrence__runtime_key_id", "occurrence__runtime_key__runtime_group")
        .first()
    )
    if found is None:
        return False
    proposer_id, proposer_group = found
    if proposer_id is None or proposer_id == runtime_key.pk:
        return False
    return not (runtime_key.runtime_group and proposer_group == runtime_key.runtime_group)


@sensitive_variables("raw")
def approval_deliver_token(
    *, occurrence: Occurrence, runtime_key: RuntimeKey | None = None, execution_id: str = ""
) -> DeliveredToken:
    """Mint the approval's token and hand it out: once, or once per ask of one execution.

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
            "other_runtime_key",
            "Another runtime key proposed this request; only that key, or a key an admin "
            "put in the same runtime group, may pick up its token.",
            403,
        )
    approval = _current_approval(occurrence)
    if approval is None:
        if occurrence.status == Occurrence.Status.REJECTED:
            raise ServiceError(
                "rejected",
                f"A reviewer rejected this request: {occurrence.rejection_reason}",
                details=rejection_details(occurrence),
            )
        if occurrence.status == Occurrence.Status.AUTO_ADMITTED:
            raise ServiceError(
                "auto_admitted", "This call was admitted by policy; it needs no token."
            )
        raise ServiceError("not_approved", "This request has not been approved yet.")

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
            actor=_runtime_actor(runtime_key),
            token_fingerprint=fingerprint,
            execution_id=execution_id,
            data={"retired_fingerprint": previous.fingerprint} if previous is not None else None,
        )
    approval.refresh_from_db()
    return DeliveredToken(token=raw, approval=approval, redelivered=previous is not None)


def _refuse_delivery(approval_id: int, execution_id: str) -> NoReturn:
    """Say why the approval's token cannot be handed out (again), from the row as it is."""
    approval = Approval.objects.annotate(db_now=DbNow()).get(pk=approval_id)
    if approval.state == Approval.State.CONSUMED and execution_id:
        command = Command.objects.filter(approval_id=approval.pk).values_list("id", flat=True)
        raise ServiceError(
            "claimed",
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
            "token_already_delivered",
            "The token for this approval was already picked up."
            + (
                " Only the execution it was delivered to may ask for it again."
                if approval.bound_execution_id
                else ""
            ),
        )
    if approval.state == Approval.State.REVOKED:
        raise ServiceError("revoked", f"An admin revoked this approval: {approval.revoke_reason}")
    if approval.state == Approval.State.EXPIRED or approval.expires_at <= approval.db_now:  # type: ignore[attr-defined]
        raise ServiceError("expired", "This approval expired before its token was picked up.")
    raise ServiceError("not_approved", "The approved version is no longer current.")


# The claim's decisions and reasons (``approvals.vocabulary``), by their old names here too.
Decision = ClaimDecision
Reason = ClaimReason


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
    found = ToolContract.objects.filter(name=tool).values_list("json_schema", "adapter").first()
    if found is None:
        return None, Command.ExecutedBy.RUNTIME
    schema, adapter = found
    executed_by = Command.ExecutedBy.CONSOLE if adapter else Command.ExecutedBy.RUNTIME
    try:
        validate_arguments(schema, arguments)
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
    tenant never issued count against the key's audit budget (``approvals.ratelimit``).

    The statements themselves are in ``approvals.claim_sql``.
    """
    digest, executed_by = _claimable_digest(tool, arguments)
    token_hash = tokens.hash_secret(token)
    # Which key proposed a request never changes, so this read cannot race the guard: a
    # key outside the proposer's runtime is refused before anything could be consumed.
    other_key = runtime_key is not None and _claimed_by_other_key(
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
                runtime_key=runtime_key,
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
            executed_by=executed_by,
        )
        Occurrence.objects.filter(
            pk=consumed.occurrence_id, status=Occurrence.Status.APPROVED
        ).update(status=Occurrence.Status.CLAIMED, updated_at=DbNow())
        audit_record(
            kind=AuditKind.CLAIM_APPROVED,
            tenant=tenant,
            occurrence=consumed.occurrence_id,
            actor=_runtime_actor(runtime_key),
            token_fingerprint=consumed.fingerprint,
            decision=Decision.APPROVED,
            reason_code=Reason.CLAIMED,
            execution_id=execution_id,
            message_id=message_id,
            command_id=command.id,
            data={
                "epoch": epoch.number,
                "idempotency_key": command.idempotency_key,
                "executed_by": executed_by,
            },
        )
        # The command row is the outbox; whoever dispatches hears of it only once it is
        # committed (and a periodic sweep finds any announcement that got lost).
        transaction.on_commit(
            functools.partial(command_announce, command_id=command.id, executed_by=executed_by)
        )
    return ClaimResult(Decision.APPROVED, Reason.CLAIMED, command)


def command_announce(*, command_id: uuid.UUID, executed_by: str) -> None:
    """Tell whoever dispatches commands (``reconciliation``, which sits above this app)
    that a command was committed. Never raises: the command is already committed, and a
    receiver's failure (a broker that is down) is what the outbox sweep is for."""
    signals.command_committed.send_robust(
        sender=Command, command_id=command_id, executed_by=executed_by
    )


def _explain_refusal(
    approval: claim_sql.FoundApproval, digest: str | None, tool: str, execution_id: str
) -> tuple[ClaimDecision, ClaimReason]:
    """``digest`` is None when the presented action breaks its contract."""
    if approval.state == Approval.State.CONSUMED:
        if approval.consumed_by_execution != execution_id:
            return Decision.REPLAYED, Reason.CONSUMED_BY_OTHER_EXECUTION
        if digest is None:
            return Decision.SCOPE_MISMATCH, Reason.ACTION_INVALID
        if approval.action_digest == digest:
            return Decision.DUPLICATE_DELIVERY, Reason.SAME_EXECUTION_REDELIVERY
        return Decision.SCOPE_MISMATCH, Reason.ACTION_DIFFERS
    if approval.bound_execution_id and approval.bound_execution_id != execution_id:
        # The token was delivered to another execution: whoever presents it copied it.
        return Decision.REPLAYED, Reason.BOUND_TO_OTHER_EXECUTION
    if approval.state == Approval.State.REVOKED:
        return Decision.REVOKED, Reason.REVOKED_BY_ADMIN
    if approval.state == Approval.State.EXPIRED or approval.expired:
        return Decision.EXPIRED, Reason.EXPIRED
    if approval.superseded:
        return Decision.SCOPE_MISMATCH, Reason.PROPOSAL_SUPERSEDED
    if digest is None:
        return Decision.SCOPE_MISMATCH, Reason.ACTION_INVALID
    if approval.tool_name != tool:
        return Decision.SCOPE_MISMATCH, Reason.TOOL_DIFFERS
    return Decision.SCOPE_MISMATCH, Reason.ACTION_DIFFERS


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
    ``security.refusals_burst`` event (``approvals.ratelimit``). The answer is the same.
    """
    approval = claim_sql.find_approval(tenant_id=tenant.pk, token_hash=token_hash)
    command = None
    retired = None
    if approval is None or not tokens.hashes_match(approval.token_hash or "", token):
        approval = None
        retired = _retired_token(tenant, token_hash, token)
    if retired is not None:
        decision, reason = Decision.REPLAYED, Reason.TOKEN_REDELIVERED
    elif approval is None:
        decision, reason = Decision.UNKNOWN_TOKEN, Reason.NO_SUCH_TOKEN
    elif other_key:
        decision, reason = Decision.SCOPE_MISMATCH, Reason.OTHER_RUNTIME_KEY
    else:
        decision, reason = _explain_refusal(approval, digest, tool, execution_id)
        if decision == Decision.DUPLICATE_DELIVERY:
            command = Command.objects.get(approval_id=approval.id)
    if (
        decision == Decision.UNKNOWN_TOKEN
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
        actor=_runtime_actor(runtime_key),
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


# --- revocation (the kill switch) -------------------------------------------------------


def approval_revoke(*, approval: Approval, admin: User, reason: str) -> bool:
    """An admin revokes one approval. Returns whether it was still revocable; when it was
    not, ``approval_revoke_refusal`` says why in words."""
    _require_role(admin, approval.tenant_id, Membership.Role.ADMIN)
    revoked = approvals_revoke(
        approvals=Approval.objects.filter(pk=approval.pk), actor=_username(admin), reason=reason
    )
    return revoked == 1


def approvals_revoke(
    *, approvals: QuerySet[Approval], actor: str, reason: str, batch: str = ""
) -> int:
    """Revoke every approval in ``approvals`` that could still authorize something (issued,
    not superseded by an edit, not past its expiry); returns how many."""
    return len(approvals_revoke_ids(approvals=approvals, actor=actor, reason=reason, batch=batch))


def approvals_revoke_ids(
    *, approvals: QuerySet[Approval], actor: str, reason: str, batch: str = ""
) -> list[int]:
    """``approvals_revoke``, returning the ids it revoked. ``batch`` (a bulk revocation's
    id) goes into each ``approval.revoked`` event, so the events of one decision can be
    found together."""
    reason = (reason or "").strip()
    if not reason:
        raise InputError("reason_required", "Say why the approvals are revoked.", "reason")
    data = {"reason": reason, **({"batch": batch} if batch else {})}
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
    *, approvals: QuerySet[Approval], admin: User, reason: str, batch: str = ""
) -> list[int]:
    """A bulk revocation from the console: only approvals of tenants where ``admin`` is an
    admin are touched, whatever ``approvals`` holds. Returns the ids revoked."""
    if not admin.is_authenticated:
        raise ServiceError("forbidden", "Sign in as an admin of the tenant.", 403)
    admin_of = Membership.objects.filter(user_id=admin.pk, role=Membership.Role.ADMIN).values(
        "tenant_id"
    )
    return approvals_revoke_ids(
        approvals=approvals.filter(tenant_id__in=admin_of),
        actor=_username(admin),
        reason=reason,
        batch=batch,
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


# --- expiry ------------------------------------------------------------------------------

# One sweep expires at most this many approvals; the next run takes the rest.
EXPIRE_BATCH = 500


def approvals_expire() -> int:
    """Write down what the clock already decided: every issued approval past its expiry
    becomes ``expired`` (audited as ``approval.expired``), and its occurrence, if still
    approved, becomes ``expired`` too, so that the inbox's filters agree with its badges.

    A claim never depended on this (the guard compares ``expires_at`` with the database's
    clock); rows another transaction holds are skipped and taken by the next sweep."""
    with transaction.atomic():
        targets = list(
            Approval.objects.filter(state=Approval.State.ISSUED, expires_at__lte=DbNow())
            .select_for_update(of=("self",), skip_locked=True)
            .order_by("pk")
            .values("pk", "tenant_id", "occurrence_id", "fingerprint", "expires_at")[:EXPIRE_BATCH]
        )
        if not targets:
            return 0
        expired = Approval.objects.filter(
            pk__in=[t["pk"] for t in targets], state=Approval.State.ISSUED
        ).update(state=Approval.State.EXPIRED)
        Occurrence.objects.filter(
            pk__in=[t["occurrence_id"] for t in targets], status=Occurrence.Status.APPROVED
        ).update(status=Occurrence.Status.EXPIRED, updated_at=DbNow())
        for target in targets:
            audit_record(
                kind=AuditKind.APPROVAL_EXPIRED,
                tenant=target["tenant_id"],
                occurrence=target["occurrence_id"],
                actor="clock",
                token_fingerprint=target["fingerprint"],
                decision=ClaimDecision.EXPIRED,
                reason_code=EventReason.EXPIRED_UNCLAIMED,
                data={"expires_at": target["expires_at"].isoformat()},
            )
    return expired
