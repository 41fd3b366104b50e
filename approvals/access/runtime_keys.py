"""Runtime keys: an agent runtime's credential, created by an admin, authenticated on every
API call (through ``keycache``), and the runtime group that lets keys act for each other."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from approvals.access import keycache, tokens
from approvals.access.tenancy import User, require_role, username_of
from approvals.audit.record import audit_record
from approvals.errors import InputError
from approvals.models import (
    Approval,
    Membership,
    Occurrence,
    RuntimeKey,
    Tenant,
)
from approvals.sql import fetch, on_postgresql
from approvals.vocabulary import (
    AuditKind,
    EventDecision,
)


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
    most once a second per process (``approvals.access.keycache``): a deactivated key is refused
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
    require_role(admin, tenant.pk, Membership.Role.ADMIN)
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
                actor=username_of(admin),
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
    require_role(admin, key.tenant_id, Membership.Role.ADMIN)
    with transaction.atomic():
        changed = RuntimeKey.objects.filter(pk=key.pk, is_active=True).update(
            is_active=False, deactivated_at=timezone.now()
        )
        # This process refuses the key from now on; the others within a second (keycache).
        transaction.on_commit(functools.partial(keycache.forget, key.pk))
        if changed:
            audit_record(
                kind=AuditKind.RUNTIME_KEY_DEACTIVATED,
                tenant=key.tenant_id,
                actor=username_of(admin),
                decision=EventDecision.DEACTIVATED,
                data={"key_id": key.pk, "name": key.name, "prefix": key.prefix},
            )
    return bool(changed)


def runtime_key_reactivation_until(key: RuntimeKey) -> datetime | None:
    """Until when a deactivated key can be reactivated; None if it cannot (active, or
    deactivated before deactivations were timed)."""
    if key.is_active or key.deactivated_at is None:
        return None
    return key.deactivated_at + timedelta(hours=settings.RUNTIME_KEY_REACTIVATION_HOURS)


def runtime_key_reactivate(*, key: RuntimeKey, admin: User) -> bool:
    """An admin undoes a deactivation within the grace period: the key authenticates again
    from the next request. Returns whether it changed (a guarded UPDATE: the key must still
    be deactivated, and recently enough, when the row is written)."""
    require_role(admin, key.tenant_id, Membership.Role.ADMIN)
    grace = timedelta(hours=settings.RUNTIME_KEY_REACTIVATION_HOURS)
    with transaction.atomic():
        changed = RuntimeKey.objects.filter(
            pk=key.pk, is_active=False, deactivated_at__gt=timezone.now() - grace
        ).update(is_active=True, deactivated_at=None)
        if changed:
            audit_record(
                kind=AuditKind.RUNTIME_KEY_REACTIVATED,
                tenant=key.tenant_id,
                actor=username_of(admin),
                decision=EventDecision.REACTIVATED,
                data={"key_id": key.pk, "name": key.name, "prefix": key.prefix},
            )
    return bool(changed)


def runtime_actor(runtime_key: RuntimeKey | None) -> str:
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


def proposer_of_token(*, tenant_id: int, token_hash: str) -> QuerySet[Any, tuple[Any, ...]]:
    """The key that proposed the request of the tenant's approval with this token hash, and
    its runtime group: ``claimed_by_other_key``'s read, as the queryset SQLite runs (the twin
    ``tests/approvals/test_hot_path_sql.py`` holds the SQL equal to)."""
    return Approval.objects.filter(tenant_id=tenant_id, token_hash=token_hash).values_list(
        "occurrence__runtime_key_id", "occurrence__runtime_key__runtime_group"
    )


# On PostgreSQL, as SQL: every claim asks it before its guard, and the queryset cost
# Django more CPU to build (its two joins) than the database to run. ``token_hash`` is
# unique: no order is needed to pick the one row.
_PROPOSER_SQL = " ".join(
    f"""SELECT o.runtime_key_id, k.runtime_group
  FROM {Approval._meta.db_table} a
  JOIN {Occurrence._meta.db_table} o ON o.id = a.occurrence_id
  LEFT JOIN {RuntimeKey._meta.db_table} k ON k.id = o.runtime_key_id
 WHERE a.tenant_id = %s AND a.token_hash = %s""".split()  # noqa: S608 (no input in the text)
)


def claimed_by_other_key(runtime_key: RuntimeKey, *, tenant: Tenant, token_hash: str) -> bool:
    """Whether the tenant's approval with this token hash belongs to a request that
    ``runtime_key`` may not claim (one read; False when there is no such approval)."""
    if on_postgresql():
        rows = fetch(_PROPOSER_SQL, [tenant.pk, token_hash])
        found = rows[0] if rows else None
    else:
        found = proposer_of_token(tenant_id=tenant.pk, token_hash=token_hash).first()
    if found is None:
        return False
    proposer_id, proposer_group = found
    if proposer_id is None or proposer_id == runtime_key.pk:
        return False
    return not (runtime_key.runtime_group and proposer_group == runtime_key.runtime_group)
