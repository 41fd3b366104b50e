"""What an adapter gets and what it answers.

An adapter never raises for an outcome the remote reported: it returns one of the typed
results below, and ``reconciliation.dispatch`` decides what the result means for the
command's effect. The distinction that matters is between a refusal the remote made
*before* doing anything (``Rejected``: nothing happened, so calling again is safe when the
contract allows it) and anything else that went wrong (``Unknown``: the effect may exist).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from approvals.outbound.client import pooled_client


@dataclass(frozen=True)
class Call:
    """One command as an adapter sees it."""

    command_id: str
    idempotency_key: str
    tool: str
    arguments: dict[str, Any]
    tenant_id: int


@dataclass(frozen=True)
class Committed:
    receipt: str
    detail: str = ""


@dataclass(frozen=True)
class Rejected:
    """Refused before execution. ``retryable``: the refusal was momentary (unavailable,
    connection refused), so a later call under the same key may succeed."""

    reason: str
    retryable: bool = False


@dataclass(frozen=True)
class Unknown:
    why: str


@dataclass(frozen=True)
class Interrupted:
    """An authentication challenge: every ``WWW-Authenticate`` value exactly as received."""

    challenges: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass(frozen=True)
class NotFound:
    """An effect query found no effect under the key."""

    detail: str = ""


Result = Committed | Rejected | Unknown | Interrupted
QueryResult = Committed | NotFound | Unknown | Interrupted


class Adapter(Protocol):
    name: str
    #: Whether ``query_effect`` can tell a committed effect from none.
    can_query: bool
    can_compensate: bool

    def execute(self, call: Call) -> Result: ...

    def query_effect(self, call: Call) -> QueryResult: ...

    def compensate(self, call: Call, receipt: str) -> Result: ...


def http_client() -> httpx.Client:
    """The process's client (one per worker process, its connections pooled; not to be
    closed) with explicit timeouts, a total deadline and a size cap
    (``approvals.outbound.client``): a call that hangs or dribbles is an unknown outcome
    after ``ADAPTER_READ_TIMEOUT`` or ``OUTBOUND_DEADLINE_SECONDS`` seconds, never a worker
    stuck for ever. The adapters' URLs are the operator's (``PAYMENTS_URL``, a tenant's
    webhook target, set in the admin), so they may be private addresses."""
    return pooled_client(public_only=False)


def transport_failure(exc: httpx.HTTPError) -> Result:
    """What a failed HTTP exchange proves. A connection that was never made sent nothing;
    anything after the request may have left (a timeout, a reset) is unknown."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Rejected(f"could not connect: {type(exc).__name__}", retryable=True)
    return Unknown(f"{type(exc).__name__} after the request was sent: {exc}")


def challenges_of(response: httpx.Response) -> list[str]:
    return response.headers.get_list("www-authenticate")
