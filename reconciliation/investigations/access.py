"""Who may investigate (operators and admins, in their tenants), and what a query names: a
fingerprint, an execution, a command, an occurrence; a raw token is refused unread."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth import get_user_model

from approvals.access import tokens
from approvals.models import (
    Membership,
)

User = get_user_model()


@dataclass(frozen=True)
class InvestigatorAccess:
    """The tenants where a user is an operator or an admin (and, for the header's Access
    tokens link, a reviewer), from the memberships the page reads with the header."""

    operator_tenant_ids: frozenset[int]
    admin_tenant_ids: frozenset[int]
    reviewer_tenant_ids: frozenset[int] = frozenset()

    @property
    def tenant_ids(self) -> list[int]:
        return sorted(self.operator_tenant_ids | self.admin_tenant_ids)


def investigator_access(memberships: Iterable[Membership]) -> InvestigatorAccess:
    """From the user's memberships (the page reads them with the header's unread count,
    ``console_memberships``: one query for both)."""
    by_role: dict[str, set[int]] = {role: set() for role in Membership.Role.values}
    for membership in memberships:
        by_role[membership.role].add(membership.tenant_id)
    return InvestigatorAccess(
        frozenset(by_role[Membership.Role.OPERATOR]),
        frozenset(by_role[Membership.Role.ADMIN]),
        frozenset(by_role[Membership.Role.REVIEWER]),
    )


QUERY_MAX_CHARS = 200  # the longest execution id


_RAW_TOKEN = re.compile(re.escape(tokens.APPROVAL_TOKEN_PREFIX) + r"[A-Za-z0-9_-]{16,}")


# The other secrets the console issues (tokens.SECRET_PREFIXES): never searched for, never
# put in an address; what they are, and what to do about one that was pasted.
_OTHER_SECRETS = (
    (tokens.RUNTIME_KEY_PREFIX, "a runtime key", "deactivate it"),
    (tokens.REVIEWER_TOKEN_PREFIX, "a reviewer's access token", "revoke it"),
    (tokens.CALLBACK_SECRET_PREFIX, "a callback signing secret", "register a new one"),
)
assert {tokens.APPROVAL_TOKEN_PREFIX, *(p for p, _, _ in _OTHER_SECRETS)} == set(
    tokens.SECRET_PREFIXES
)


@dataclass(frozen=True)
class QueryRead:
    """The search box's text as the investigation uses it. A raw approval token is never
    searched for nor shown: its fingerprint is (``fingerprint_of_token``); any other
    secret the console issues (a runtime key, an access token, a callback secret) is
    refused."""

    q: str
    refusal: str = ""
    fingerprint_of_token: str = ""


def query_read(raw: str) -> QueryRead:
    text = (raw or "").strip()
    token = _RAW_TOKEN.search(text)
    if token:
        return QueryRead("", fingerprint_of_token=tokens.fingerprint(token.group(0)))
    for prefix, what, undo in _OTHER_SECRETS:
        if text.startswith(prefix) and len(text) > 20:
            return QueryRead(
                "",
                refusal=f"That looks like {what}. It was not searched for and is not shown; "
                f"treat it as exposed and {undo} if it is real.",
            )
    if len(text) > QUERY_MAX_CHARS:
        return QueryRead("", refusal=f"Search for one id of at most {QUERY_MAX_CHARS} characters.")
    return QueryRead(text)
