"""One exception hierarchy for every refusal of the agent API.

Every 4xx carries ``{"error": {"code", "message", "details"}}``; a claim refusal also
carries ``decision`` and ``reason`` at the top. :func:`error_from_response` turns such an
answer into the most precise class below (by ``code``, then by HTTP status), keeping the
code, message and details as attributes. Nothing here ever holds a raw token.
"""

from __future__ import annotations

from typing import Any


class ConsoleError(Exception):
    """Anything the client could not do. ``retry_after`` is the server's advice in seconds
    (``Retry-After``), when it gave one."""

    status: int | None = None
    code: str = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        details: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.details = details
        self.retry_after = retry_after

    def __str__(self) -> str:
        prefix = f"{self.status} " if self.status is not None else ""
        return f"{prefix}{self.code}: {self.message}"


class TransportError(ConsoleError):
    """The console could not be reached, or the connection broke (retried where safe)."""

    code = "transport_error"


class WaitTimeout(ConsoleError):
    """``wait`` gave up: the occurrence was still in its state when the time ran out."""

    code = "wait_timeout"


class APIError(ConsoleError):
    """The console answered with an error status."""


# --- by status --------------------------------------------------------------------------


class InvalidRequest(APIError):
    """400, 413, 415, 422: the request was refused as it is (``details`` names each field);
    nothing was written."""


class Unauthenticated(APIError):
    """401: the runtime key is missing, wrong or deactivated."""


class Forbidden(APIError):
    """403."""


class NotFound(APIError):
    """404: no such resource for this key's tenant."""


class Conflict(APIError):
    """409: the state does not allow it (``details`` has the facts)."""


class RateLimited(APIError):
    """429 after the client's retries ran out."""


class Unavailable(APIError):
    """503 after the client's retries ran out."""


class ServerError(APIError):
    """5xx other than 503: a bug on the server's side."""


# --- by code ----------------------------------------------------------------------------


class NotApproved(Conflict):
    """``409 not_approved``: not (yet) approved; ask again after ``retry_after``."""


class Rejected(Conflict):
    """``409 rejected``: a reviewer (or the repeat policy) rejected it; ``reason`` says why."""

    @property
    def reason(self) -> str:
        details = self.details if isinstance(self.details, dict) else {}
        return str(details.get("reason") or "")


class TokenAlreadyDelivered(Conflict):
    """``409 token_already_delivered``: picked up before, by another execution (or without
    an execution id)."""


class AlreadyClaimed(Conflict):
    """``409 claimed``: the approval was claimed; ``command_id`` and ``execution_id`` name the
    command and the execution that consumed it."""

    @property
    def command_id(self) -> str | None:
        value = (self.details or {}).get("command_id") if isinstance(self.details, dict) else None
        return str(value) if value else None

    @property
    def execution_id(self) -> str | None:
        value = (self.details or {}).get("execution_id") if isinstance(self.details, dict) else None
        return str(value) if value else None


class ApprovalExpired(Conflict):
    """``409 expired``: the approval expired unclaimed; ``renew`` sends it back to review."""


class ApprovalRevoked(Conflict):
    """``409 revoked``: an admin revoked the approval."""


class ClientRefConflict(Conflict):
    """``409 client_ref_conflict``: this run used the ``client_ref`` for another action."""


class ExecutedByConsole(Conflict):
    """``409 executed_by_console``: the console executes this command through its adapter
    and records its effect; a runtime has nothing to report (wait for the effect instead)."""


class NotRenewable(Conflict):
    """A renewal refused: ``pending_review``, ``not_expired``, ``auto_admitted``."""


class EffectAlreadyRecorded(Conflict):
    """``409 effect_already_recorded``: the command's effect was settled otherwise."""


class NeedsReconciliation(Conflict):
    """``409 needs_reconciliation``: an unknown effect must be reconciled first."""


class OtherRuntimeKey(Forbidden):
    """``403 other_runtime_key``: another runtime key proposed this request."""


class NotYourCommand(Forbidden):
    """``403 not_your_command``: only the execution holding the command's epoch may report."""


class ClaimRefused(Forbidden):
    """A claim the console refused (403): ``decision`` and ``reason`` as the console names
    them (``replayed``/``consumed_by_other_execution``, ``replayed``/``token_redelivered``,
    ``replayed``/``bound_to_other_execution``, ``scope_mismatch``/``action_differs``, ...)."""

    def __init__(self, message: str, *, decision: str, reason: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.decision = decision
        self.reason = reason


class Replayed(ClaimRefused):
    pass


class ScopeMismatch(ClaimRefused):
    pass


class ClaimExpired(ClaimRefused):
    pass


class ClaimRevoked(ClaimRefused):
    pass


class UnknownToken(ClaimRefused):
    pass


_BY_CODE: dict[str, type[APIError]] = {
    "not_approved": NotApproved,
    "rejected": Rejected,
    "token_already_delivered": TokenAlreadyDelivered,
    "claimed": AlreadyClaimed,
    "expired": ApprovalExpired,
    "revoked": ApprovalRevoked,
    "client_ref_conflict": ClientRefConflict,
    "pending_review": NotRenewable,
    "not_expired": NotRenewable,
    "auto_admitted": NotRenewable,
    "effect_already_recorded": EffectAlreadyRecorded,
    "needs_reconciliation": NeedsReconciliation,
    "executed_by_console": ExecutedByConsole,
    "other_runtime_key": OtherRuntimeKey,
    "not_your_command": NotYourCommand,
}

_CLAIM_REFUSALS: dict[str, type[ClaimRefused]] = {
    "replayed": Replayed,
    "scope_mismatch": ScopeMismatch,
    "expired": ClaimExpired,
    "revoked": ClaimRevoked,
    "unknown_token": UnknownToken,
}

_BY_STATUS: dict[int, type[APIError]] = {
    400: InvalidRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    429: RateLimited,
    503: Unavailable,
}


def error_from_response(status: int, body: Any, retry_after: float | None = None) -> APIError:
    """The exception for an error answer (``body`` is its parsed JSON, or anything else)."""
    envelope = body.get("error") if isinstance(body, dict) else None
    if not isinstance(envelope, dict):
        envelope = {}
    code = str(envelope.get("code") or f"http_{status}")
    message = str(envelope.get("message") or f"The console answered {status}.")
    details = envelope.get("details")
    if (
        status == 403
        and isinstance(body, dict)
        and isinstance(body.get("decision"), str)
        and isinstance(body.get("reason"), str)
    ):
        decision, reason = body["decision"], body["reason"]
        refusal = _CLAIM_REFUSALS.get(decision, ClaimRefused)
        return refusal(
            message,
            decision=decision,
            reason=reason,
            code=code,
            status=status,
            details=details,
            retry_after=retry_after,
        )
    cls = _BY_CODE.get(code)
    if cls is None or not _status_matches(cls, status):
        cls = _BY_STATUS.get(status, ServerError if status >= 500 else APIError)
    return cls(message, code=code, status=status, details=details, retry_after=retry_after)


def _status_matches(cls: type[APIError], status: int) -> bool:
    """A code's class is used only with the status family it belongs to."""
    for family, base in ((409, Conflict), (403, Forbidden)):
        if issubclass(cls, base):
            return status == family
    return True
