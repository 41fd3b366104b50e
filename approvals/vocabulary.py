"""The console's words for what happens to a claim, typed once.

Services decide with these, the API's schemas list them, presenters and the operators'
pages name them, and tests compare with them. Each is a ``TextChoices``: its members are
the strings stored in audit events and sent over the API, so comparing a member with a
stored string just works, and a misspelt member is an error rather than a silent miss.

Effect states are ``Command.State`` and occurrence statuses ``Occurrence.Status`` (on the
pages ``claimed`` is called *consumed*, as the approval's state is: its label).
"""

from __future__ import annotations

from typing import Literal, get_args

from django.db import models


class ClaimDecision(models.TextChoices):
    """What a claim was answered: the first two admit it, the rest refuse it."""

    APPROVED = "approved", "Approved"
    DUPLICATE_DELIVERY = "duplicate_delivery", "Duplicate delivery"
    REPLAYED = "replayed", "Replayed"
    SCOPE_MISMATCH = "scope_mismatch", "Scope mismatch"
    EXPIRED = "expired", "Expired"
    REVOKED = "revoked", "Revoked"
    UNKNOWN_TOKEN = "unknown_token", "Unknown token"


# Claims that hand out the command: the first one, and a redelivery to the same execution.
ADMITTING = (ClaimDecision.APPROVED, ClaimDecision.DUPLICATE_DELIVERY)
# Refused uses of an approval: each is security evidence.
REFUSING = (
    ClaimDecision.REPLAYED,
    ClaimDecision.SCOPE_MISMATCH,
    ClaimDecision.EXPIRED,
    ClaimDecision.REVOKED,
    ClaimDecision.UNKNOWN_TOKEN,
)

# The same two groups as the API's schemas spell them (pydantic wants literals); a test
# holds them equal to the groups above.
AdmittingDecision = Literal["approved", "duplicate_delivery"]
RefusingDecision = Literal["replayed", "scope_mismatch", "expired", "revoked", "unknown_token"]


class ClaimReason(models.TextChoices):
    """Why a claim got its decision (``reason`` in the answer, ``reason_code`` in audit)."""

    CLAIMED = "claimed", "Claimed"
    SAME_EXECUTION_REDELIVERY = "same_execution_redelivery", "The same execution again"
    CONSUMED_BY_OTHER_EXECUTION = "consumed_by_other_execution", "Another execution claimed it"
    BOUND_TO_OTHER_EXECUTION = "bound_to_other_execution", "Delivered to another execution"
    TOKEN_REDELIVERED = "token_redelivered", "A re-delivery replaced this token"
    OTHER_RUNTIME_KEY = "other_runtime_key", "Another runtime's request"
    ACTION_INVALID = "action_invalid", "The action breaks its contract"
    ACTION_DIFFERS = "action_differs", "Another action than the approved one"
    TOOL_DIFFERS = "tool_differs", "Another tool than the approved one"
    PROPOSAL_SUPERSEDED = "proposal_superseded", "A newer version replaced it"
    REVOKED_BY_ADMIN = "revoked_by_admin", "An admin revoked it"
    EXPIRED = "expired", "Expired"
    NO_SUCH_TOKEN = "no_such_token", "No such token"


def literal_values(literal: object) -> tuple[str, ...]:
    return tuple(get_args(literal))
