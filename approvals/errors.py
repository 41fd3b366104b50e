"""What the console refuses, as exceptions with a stable machine-readable code: ``InputError``
for bad input from outside (a 4xx naming the field), ``ServiceError`` for a refused state
change, whose codes, and the API's own, are ``ErrorCode``'s members."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """The code of a refusal: ``error.code`` in an API answer, ``ServiceError.code`` for
    the pages. Clients and the pages branch on these strings, so a value never changes (add
    a member instead); ``tests/approvals/test_vocabulary_typed_words.py`` fails on one
    typed in place. Codes of bad input (``InputError``) name what was wrong with a field
    and are given where the input is read."""

    # The API's envelope: who may call, and what a request must look like.
    BAD_REQUEST = "bad_request"
    UNAUTHENTICATED = "unauthenticated"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    EMPTY_BODY = "empty_body"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    RATE_LIMITED = "rate_limited"
    DATABASE_UNAVAILABLE = "database_unavailable"
    SERVER_ERROR = "server_error"
    # A proposal and its review.
    CLIENT_REF_CONFLICT = "client_ref_conflict"
    NOT_PENDING = "not_pending"
    PENDING_REVIEW = "pending_review"
    SELF_APPROVAL = "self_approval"
    STALE_DIGEST = "stale_digest"
    NOT_EDITABLE = "not_editable"
    # Nobody decided before the contract's final deadline: nothing can approve it now.
    TIMED_OUT = "timed_out"
    # An approval, its token and its renewal.
    NOT_APPROVED = "not_approved"
    AUTO_ADMITTED = "auto_admitted"
    REJECTED = "rejected"
    REVOKED = "revoked"
    EXPIRED = "expired"
    NOT_EXPIRED = "not_expired"
    CLAIMED = "claimed"
    TOKEN_ALREADY_DELIVERED = "token_already_delivered"
    OTHER_RUNTIME_KEY = "other_runtime_key"
    # A command's effect, as a runtime reports it, and new epochs.
    NOT_YOUR_COMMAND = "not_your_command"
    EPOCH_CHANGED = "epoch_changed"
    EXECUTED_BY_CONSOLE = "executed_by_console"
    # A registration (approvals.contracts) that would change what a contract means in a way
    # a registration may not: a console-executed contract, or a schema the console refuses.
    CONTRACT_NOT_REGISTRABLE = "contract_not_registrable"
    EFFECT_ALREADY_RECORDED = "effect_already_recorded"
    EFFECT_COMMITTED = "effect_committed"
    NEEDS_RECONCILIATION = "needs_reconciliation"
    EXECUTION_ID_USED = "execution_id_used"
    NO_COMMAND = "no_command"
    # Operators' decisions and credentials.
    NOTE_REQUIRED = "note_required"
    OUTCOME_REQUIRED = "outcome_required"
    EVIDENCE_REQUIRED = "evidence_required"
    SEEN_STATE_INVALID = "seen_state_invalid"
    STATE_CHANGED = "state_changed"
    NOT_COMMITTED = "not_committed"
    NOT_JUSTIFIED = "not_justified"
    CANNOT_QUERY = "cannot_query"
    CANNOT_COMPENSATE = "cannot_compensate"
    NO_RECEIPT = "no_receipt"
    COMPENSATION_IN_PROGRESS = "compensation_in_progress"
    COMPENSATION_FAILED = "compensation_failed"
    SECRET_REQUIRED = "secret_required"
    # "I'm on it": who holds a queue item.
    TAKEN_BY_OTHER = "taken_by_other"
    NOT_HOLDER = "not_holder"


class InputError(Exception):
    """Bad input from outside, with a stable machine-readable code and the field it names."""

    def __init__(
        self,
        code: str,
        message: str,
        field: str | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.details = details or []


class ServiceError(Exception):
    """A refused state change: a stable code, a message for people, an HTTP status, and
    ``details``: the refusal's facts as fields (a rejection's ``reason``), for programs."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        status: int = 409,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.details = details
