"""Reviewers' personal access tokens: approve and reject through the API.

A token is a reviewer's own, for one tenant, scoped to deciding (``ReviewerToken.Scope``), valid for
7, 30 or 90 days, revocable by its owner and by the tenant's admins at once. Only its SHA-256 is
stored; the raw token is shown once, on the page that creates it. A decision made with one goes
through ``approvals.reviews.decisions.occurrence_approve`` and
``approvals.reviews.decisions.occurrence_reject``, so the page's rules hold unchanged: the reviewer
must still be a reviewer of the tenant, may not approve their own request or edit, must have seen
the current digest, and a quorum counts distinct people.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from approvals.access import tokens
from approvals.access.tenancy import has_role
from approvals.audit.record import audit_record
from approvals.errors import ErrorCode, InputError, ServiceError
from approvals.models import Membership, ReviewerToken, Tenant
from approvals.vocabulary import AuditKind

LIFETIME_DAYS = (7, 30, 90)
# last_used_at is written at most once a minute per token, like a runtime key's.
LAST_USED_PRECISION = timedelta(minutes=1)


@sensitive_variables("raw")
def reviewer_token_issue(
    *, user: AbstractBaseUser, tenant: Tenant, name: str, lifetime_days: int
) -> tuple[ReviewerToken, str]:
    """Create a token for ``user`` in ``tenant``; return it and the raw token (shown once)."""
    if not has_role(user, tenant.pk, Membership.Role.REVIEWER):
        raise ServiceError(
            ErrorCode.FORBIDDEN, "Only a reviewer of this tenant may create a token to decide.", 403
        )
    name = (name or "").strip()
    if not name:
        raise InputError("name_required", "Give the token a name, e.g. the tool that uses it.")
    if len(name) > 100:
        raise InputError("too_long", "Keep the name under 100 characters.")
    if lifetime_days not in LIFETIME_DAYS:
        raise InputError("invalid_lifetime", "A token lives 7, 30 or 90 days.")
    raw = tokens.mint(tokens.REVIEWER_TOKEN_PREFIX)
    now = timezone.now()
    try:
        with transaction.atomic():
            token = ReviewerToken.objects.create(
                user_id=user.pk,
                tenant=tenant,
                name=name,
                token_hash=tokens.hash_secret(raw),
                prefix=raw[:10],
                expires_at=now + timedelta(days=lifetime_days),
            )
            audit_record(
                kind=AuditKind.REVIEWER_TOKEN_CREATED,
                tenant=tenant,
                actor=str(user.get_username()),
                data={
                    "name": name,
                    "prefix": token.prefix,
                    "expires_at": token.expires_at.isoformat(),
                },
            )
    except IntegrityError as exc:
        raise InputError(
            "name_taken", f"You already have a token named {name!r} in this tenant."
        ) from exc
    return token, raw


def reviewer_token_may_revoke(user: AbstractBaseUser, token: ReviewerToken) -> bool:
    """Its owner, and the tenant's admins (a reviewer who left, a token in a leaked log)."""
    return token.user_id == user.pk or has_role(user, token.tenant_id, Membership.Role.ADMIN)


def reviewer_token_revoke(
    *, token: ReviewerToken, user: AbstractBaseUser, by_superuser: bool = False
) -> bool:
    """Revoke at once; False if it already was. The API refuses it from the next request.
    ``by_superuser``: the Django admin's action (its own permission check ran)."""
    allowed = by_superuser and getattr(user, "is_superuser", False)
    if not allowed and not reviewer_token_may_revoke(user, token):
        raise ServiceError(ErrorCode.FORBIDDEN, "This token is not yours to revoke.", 403)
    with transaction.atomic():
        now = timezone.now()
        changed = ReviewerToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=now
        )
        if changed:
            audit_record(
                kind=AuditKind.REVIEWER_TOKEN_REVOKED,
                tenant=token.tenant_id,
                actor=str(user.get_username()),
                data={"name": token.name, "prefix": token.prefix, "owner": _owner(token)},
            )
    token.refresh_from_db()
    return bool(changed)


def _owner(token: ReviewerToken) -> str:
    return str(token.user.get_username())


def owner_reviews() -> Exists:
    """Whether the token's owner is a reviewer of the token's tenant, now."""
    return Exists(
        Membership.objects.filter(
            user_id=OuterRef("user_id"),
            tenant_id=OuterRef("tenant_id"),
            role=Membership.Role.REVIEWER,
        )
    )


@sensitive_variables("raw")
def reviewer_token_authenticate(raw: str) -> ReviewerToken | None:
    """The live token ``raw`` names (not revoked, not expired, its user active), with its
    user and tenant, or None; ``token.owner_reviews`` says whether its owner is still a
    reviewer of its tenant (``reviewer_token_require_reviewer``). Read from the database on
    every call, in one query: a revocation or a removal from the tenant counts at once."""
    if not raw.startswith(tokens.REVIEWER_TOKEN_PREFIX):
        return None
    now = timezone.now()
    token = (
        ReviewerToken.objects.select_related("user", "tenant")
        .annotate(owner_reviews=owner_reviews())
        .filter(token_hash=tokens.hash_secret(raw), revoked_at__isnull=True, expires_at__gt=now)
        .first()
    )
    if token is None or not tokens.hashes_match(token.token_hash, raw):
        return None
    if not token.user.is_active:
        return None
    stale = now - LAST_USED_PRECISION
    if token.last_used_at is None or token.last_used_at < stale:
        ReviewerToken.objects.filter(pk=token.pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale)
        ).update(last_used_at=now)
        token.last_used_at = now
    return token


def reviewer_token_require_reviewer(token: ReviewerToken) -> None:
    """Refuse a token whose owner is no longer a reviewer of its tenant (removed, or left
    with another role): 403 ``forbidden``, as a decision by that owner always was. Every
    use of a token passes here, reads and long-polls included."""
    if not getattr(token, "owner_reviews", False):
        raise ServiceError(
            ErrorCode.FORBIDDEN,
            "The owner of this access token is no longer a reviewer of its tenant.",
            403,
        )


def reviewer_token_recheck(token: ReviewerToken) -> ReviewerToken | None:
    """``token`` read again, as ``reviewer_token_authenticate`` reads it, or None when it no
    longer authenticates: a long-poll that waits in its thread asks before each read."""
    return (
        ReviewerToken.objects.select_related("user", "tenant")
        .annotate(owner_reviews=owner_reviews())
        .filter(
            pk=token.pk,
            revoked_at__isnull=True,
            expires_at__gt=timezone.now(),
            user__is_active=True,
        )
        .first()
    )


def via(token: ReviewerToken) -> str:
    """How audit events name a decision made with ``token``."""
    return f"token:{token.name} ({token.prefix}…)"
