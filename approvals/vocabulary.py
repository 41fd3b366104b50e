"""The console's words, typed once: what happens to a claim, the kinds of its audit
events, the effects a runtime reports, what the review page's decision panel and the
operators' queue show.

Services decide with these, the API's schemas list them, presenters and the operators'
pages name them, and tests compare with them. Each is a ``TextChoices``: its members are
the strings stored in audit events and sent over the API, so comparing a member with a
stored string just works, and a misspelt member is an error rather than a silent miss.
``tests/approvals/test_vocabulary_audit_kinds.py`` (audit kinds, an event's decision and
reason) and ``test_vocabulary_typed_words.py`` (every other word here) fail on a word typed
in place elsewhere. The codes of refusals (``ServiceError``) are ``approvals.errors.ErrorCode``.

Effect states are ``Command.State`` and occurrence statuses ``Occurrence.Status`` (on the
pages ``claimed`` is called *consumed*, as the approval's state is: its label); the states
of the models' rows stay on their models (``Command.State``), used as they are.
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


class EventDecision(models.TextChoices):
    """What an audit event that is no claim decided (its ``decision``). An approval that
    expired or was revoked is written with ``ClaimDecision.EXPIRED``/``REVOKED``: a claim
    of it afterwards is answered with the same word."""

    ISSUED = "issued", "Issued"
    REJECTED = "rejected", "Rejected"
    AUTO_ADMITTED = "auto_admitted", "Admitted by policy"
    DEACTIVATED = "deactivated", "Deactivated"
    REACTIVATED = "reactivated", "Reactivated"
    # The queue delivered a command whose effect was settled: nothing was called.
    IGNORED = "ignored", "Ignored"
    INTERRUPTED = "interrupted", "Interrupted"
    ADMITTED = "admitted", "Admitted"
    WAITING = "waiting", "Waiting"
    AUTHORITY_RESTORED = "authority_restored", "Authority restored"
    # An effect report from an execution that does not hold the command.
    REFUSED = "refused", "Refused"
    # An escalation to operations: whether its webhook took it.
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"
    # "I'm on it": an operator took a queue item, took it over, or let it go.
    TAKEN = "taken", "Taken"
    TAKEN_OVER = "taken_over", "Taken over"
    RELEASED = "released", "Let go"
    # A request's deadlines (``approvals.reviews.deadlines``): escalated, then timed out.
    ESCALATED = "escalated", "Escalated"
    TIMED_OUT = "timed_out", "Timed out"


# A prior decision on the same action in the run (an answer's ``prior_decisions``):
# rejections and timeouts (nobody decided before the final deadline), as
# ``EventDecision.REJECTED``/``TIMED_OUT`` are spelt.
PriorDecision = Literal["rejected", "timed_out"]


class ReviewOutcome(models.TextChoices):
    """What a reviewer's decision through the API did (its answer's ``outcome``)."""

    ISSUED = "issued", "Approval issued"
    VOTE_RECORDED = "vote_recorded", "Vote recorded toward a quorum"
    REJECTED = "rejected", "Rejected"


# The same as the API's schema spells it; a test holds it equal to the members.
ReviewOutcomeLiteral = Literal["issued", "vote_recorded", "rejected"]


class EventReason(models.TextChoices):
    """Why an audit event that is no claim decided what it did (its ``reason_code``).
    Reasons typed elsewhere keep their own words: an invocation's justification
    (``reconciliation.dispatch.Why``), an interruption's kind, an admission's
    justification."""

    REJECTED_BY_REVIEWER = "rejected_by_reviewer", "A reviewer rejected it"
    REPEAT_OF_REJECTED = "repeat_of_rejected", "A repeat of a rejected request"
    POLICY_READ_ONLY = "policy_read_only", "Read-only, admitted by policy"
    APPROVAL_EXPIRED = "approval_expired", "Its approval expired"
    APPROVAL_SUPERSEDED = "approval_superseded", "An edit superseded its approval"
    EXPIRED_UNCLAIMED = "expired_unclaimed", "Expired unclaimed"
    # A pending request's deadlines (the contract's review and final deadlines).
    REVIEW_DEADLINE_PASSED = "review_deadline_passed", "The review deadline passed"
    FINAL_DEADLINE_PASSED = "final_deadline_passed", "The final deadline passed"
    REFUSALS_BURST = "refusals_burst", "A burst of refused claims"
    OTHER_EXECUTION = "other_execution", "Another execution holds the command"
    # Why an effect was settled without a receipt.
    ATTEMPTS_EXHAUSTED = "attempts_exhausted", "No attempt left"
    AUTH_CHALLENGE = "auth_challenge", "The remote asked for authentication"
    REFUSED_BEFORE_EXECUTION = "refused_before_execution", "Refused before execution"
    AMBIGUOUS = "ambiguous", "The answer was ambiguous"
    # A queue redelivery of a command whose effect was already settled (``already``).
    ALREADY_COMMITTED = "already_committed", "Already committed"
    ALREADY_REJECTED = "already_rejected", "Already rejected"
    ALREADY_OUTCOME_UNKNOWN = "already_outcome_unknown", "Already of unknown outcome"
    ALREADY_RECONCILED = "already_reconciled", "Already reconciled"
    ALREADY_COMPENSATED = "already_compensated", "Already compensated"
    # The effect a runtime reported for a command it executed itself (``reported``).
    REPORTED_COMMITTED = "reported_committed", "Reported committed"
    REPORTED_REJECTED = "reported_rejected", "Reported rejected"
    REPORTED_OUTCOME_UNKNOWN = "reported_outcome_unknown", "Reported of unknown outcome"
    REPORTED_INTERRUPTED = "reported_interrupted", "Reported interrupted"
    # Why an operator's take ended: let go by hand, or a decision resolved the item.
    LET_GO = "let_go", "Let go by its holder"
    RESOLVED = "resolved", "A decision resolved it"

    @classmethod
    def already(cls, state: str) -> EventReason:
        """The reason of a redelivery that found the effect settled in ``state``."""
        return cls(f"{ALREADY_PREFIX}{state}")

    @classmethod
    def reported(cls, outcome: str) -> EventReason:
        """The reason of an effect a runtime reported as ``outcome``."""
        return cls(f"{REPORTED_PREFIX}{outcome}")


ALREADY_PREFIX = "already_"
REPORTED_PREFIX = "reported_"


class AuditKind(models.TextChoices):
    """What an audit event records: every ``AuditEvent.kind`` the console itself writes.

    Members are the stored strings, ``<subject>.<what happened>``; rows and the audit
    chain's hashes hold them, so a value never changes (add a member instead). Events that
    ``reconciliation`` writes are here too: it imports this app, never the reverse, and the
    review page reads them back. Other producers' ingested events keep their own kinds
    (``POST /api/v1/audit/events``), which need not be members. A kind built from another
    word goes through ``for_claim``, ``for_effect`` or ``for_operator``, which refuse a
    word that names no member."""

    # Runtime keys, reviewer tokens and callbacks: who may talk to the console.
    RUNTIME_KEY_CREATED = "runtime_key.created", "Runtime key created"
    RUNTIME_KEY_DEACTIVATED = "runtime_key.deactivated", "Runtime key deactivated"
    # An admin undid a deactivation within the grace period (RUNTIME_KEY_REACTIVATION_HOURS).
    RUNTIME_KEY_REACTIVATED = "runtime_key.reactivated", "Runtime key reactivated"
    REVIEWER_TOKEN_CREATED = "reviewer_token.created", "Reviewer token created"
    REVIEWER_TOKEN_REVOKED = "reviewer_token.revoked", "Reviewer token revoked"
    CALLBACK_REGISTERED = "callback.registered", "Callback registered"
    CALLBACK_REMOVED = "callback.removed", "Callback removed"
    # Routing (approvals.routing): an admin changed a reviewer group or a routing rule.
    ROUTING_GROUP_SAVED = "routing.group_saved", "Reviewer group saved"
    ROUTING_RULE_SAVED = "routing.rule_saved", "Routing rule saved"
    ROUTING_RULE_REMOVED = "routing.rule_removed", "Routing rule removed"
    # A tool contract registered (created or changed) by a service, e.g. the MCP gateway.
    TOOL_CONTRACT_REGISTERED = "tool_contract.registered", "Tool contract registered"
    # A proposal and its review.
    OCCURRENCE_PROPOSED = "occurrence.proposed", "Proposed"
    OCCURRENCE_AUTO_ADMITTED = "occurrence.auto_admitted", "Admitted by policy"
    OCCURRENCE_REJECTED = "occurrence.rejected", "Rejected"
    OCCURRENCE_RENEWED = "occurrence.renewed", "Renewed after expiry"
    # Nobody decided by the contract's review deadline, then by its final deadline.
    OCCURRENCE_ESCALATED = "occurrence.escalated", "Escalated"
    OCCURRENCE_TIMED_OUT = "occurrence.timed_out", "Timed out"
    PROPOSAL_EDITED = "proposal.edited", "Proposal edited"
    APPROVAL_VOTE_RECORDED = "approval.vote_recorded", "Approval vote recorded"
    APPROVAL_ISSUED = "approval.issued", "Approved"
    APPROVAL_EXPIRED = "approval.expired", "Approval expired"
    APPROVAL_REVOKED = "approval.revoked", "Approval revoked"
    TOKEN_DELIVERED = "token.delivered", "Token delivered"
    TOKEN_REDELIVERED = "token.redelivered", "Token delivered again"
    # A claim, one kind per ``ClaimDecision`` (``for_claim``).
    CLAIM_APPROVED = "claim.approved", "Claim approved"
    CLAIM_DUPLICATE_DELIVERY = "claim.duplicate_delivery", "Claim redelivered"
    CLAIM_REPLAYED = "claim.replayed", "Claim replayed"
    CLAIM_SCOPE_MISMATCH = "claim.scope_mismatch", "Claim out of scope"
    CLAIM_EXPIRED = "claim.expired", "Claim after expiry"
    CLAIM_REVOKED = "claim.revoked", "Claim after revocation"
    CLAIM_UNKNOWN_TOKEN = "claim.unknown_token", "Claim with an unknown token"
    SECURITY_REFUSALS_BURST = "security.refusals_burst", "Burst of refused claims"
    # The command's effect (``reconciliation``); settled states through ``for_effect``.
    EFFECT_SENDING = "effect.sending", "Effect sending"
    EFFECT_COMMITTED = "effect.committed", "Effect committed"
    EFFECT_REJECTED = "effect.rejected", "Effect rejected"
    EFFECT_OUTCOME_UNKNOWN = "effect.outcome_unknown", "Effect outcome unknown"
    EFFECT_RETRY_SCHEDULED = "effect.retry_scheduled", "Effect retry scheduled"
    EFFECT_LATE_RESULT = "effect.late_result", "Late adapter result"
    EFFECT_REPORT_REFUSED = "effect.report_refused", "Effect report refused"
    DISPATCH_REDELIVERED = "dispatch.redelivered", "Command redelivered by the queue"
    RECOVERY_INTERRUPTED = "recovery.interrupted", "Interrupted by a challenge"
    CREDENTIALS_REFRESHED = "credentials.refreshed", "Credentials refreshed"
    EPOCH_ADMITTED = "epoch.admitted", "New epoch admitted"
    EPOCH_WAITING = "epoch.waiting", "New epoch waiting"
    # Operators' decisions, one kind per ``OperatorDecision.Action`` (``for_operator``).
    OPERATOR_QUERY_EFFECT = "operator.query_effect", "Operator queried the effect"
    OPERATOR_RECONCILE = "operator.reconcile", "Operator reconciled"
    OPERATOR_ACCEPT_AMBIGUITY = "operator.accept_ambiguity", "Operator accepted the ambiguity"
    OPERATOR_RETRY = "operator.retry", "Operator retried"
    OPERATOR_COMPENSATE = "operator.compensate", "Operator compensated"
    OPERATIONS_ESCALATED = "operations.escalated", "Escalated to operations"
    # "I'm on it": an operator takes a queue item's occurrence, takes it over from another,
    # or lets it go (by hand, or by a decision that resolved it).
    OPERATIONS_TAKEN = "operations.taken", "Operator took it"
    OPERATIONS_TAKEN_OVER = "operations.taken_over", "Operator took it over"
    OPERATIONS_RELEASED = "operations.released", "Operator let it go"

    @classmethod
    def for_claim(cls, decision: str) -> AuditKind:
        """The kind of a claim answered ``decision`` (a ``ClaimDecision``)."""
        return cls(f"{CLAIM_PREFIX}{ClaimDecision(decision)}")

    @classmethod
    def for_effect(cls, state: str) -> AuditKind:
        """The kind of the effect's move to ``state`` (a ``Command.State``)."""
        return cls(f"{EFFECT_PREFIX}{state}")

    @classmethod
    def for_operator(cls, action: str) -> AuditKind:
        """The kind of an operator's ``action`` (an ``OperatorDecision.Action``)."""
        return cls(f"{OPERATOR_PREFIX}{action}")


# The families that are matched by prefix (``kind__startswith``, ``kind.startswith``).
CLAIM_PREFIX = "claim."
EFFECT_PREFIX = "effect."
OPERATOR_PREFIX = "operator."

# The audit kinds that tell what happened to a command after its claim. They are written
# by ``reconciliation`` (which ``approvals`` never imports); the review page reads them
# back, through an index of their own (``audit_command_effects``) whose condition names
# this tuple: a kind added here needs a migration of that index.
# An operator's reconciliation or compensation is an ``operator.*`` event, not one of these.
EFFECT_KINDS = (
    AuditKind.EFFECT_SENDING,
    AuditKind.EFFECT_COMMITTED,
    AuditKind.EFFECT_REJECTED,
    AuditKind.EFFECT_OUTCOME_UNKNOWN,
    AuditKind.EFFECT_RETRY_SCHEDULED,
    AuditKind.RECOVERY_INTERRUPTED,
    AuditKind.EPOCH_ADMITTED,
)


def literal_values(literal: object) -> tuple[str, ...]:
    return tuple(get_args(literal))


def is_refused_use(kind: str, decision: str) -> bool:
    """Whether an event records a refused use of an approval: security evidence. The
    approval's own expiry (``approval.expired``, written by the sweep or a renewal) says
    ``expired`` too, but refused nothing: nobody presented its token."""
    return decision in REFUSING and kind != AuditKind.APPROVAL_EXPIRED


# --- effects, as the API names them ------------------------------------------------------

# A command's effect in the vocabulary of DESIGN.md (``Command.effect_state``): its
# ``Command.State``, with ``pending`` called ``not_sent``.
EFFECT_NOT_SENT = "not_sent"
# The same as the API's schemas spell it (pydantic wants literals); a test holds it equal
# to ``Command.State``.
EffectState = Literal[
    "not_sent", "sending", "committed", "rejected", "outcome_unknown", "reconciled", "compensated"
]
# Who executes a command (``Command.ExecutedBy``), as the API's schemas spell it.
ExecutedBy = Literal["console", "runtime"]


class ReportedOutcome(models.TextChoices):
    """The effect a runtime reports for a command it executes itself
    (``POST /api/v1/commands/{id}/effect``)."""

    COMMITTED = "committed", "Committed"
    REJECTED = "rejected", "Rejected"
    OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"
    # An authentication challenge refused the call before execution.
    INTERRUPTED = "interrupted", "Interrupted"


# The outcomes as the API's schema spells them; a test holds them equal to the members.
ReportedOutcomeLiteral = Literal["committed", "rejected", "outcome_unknown", "interrupted"]


# --- the review page and the operators' queue --------------------------------------------


class PanelState(models.TextChoices):
    """What the review page's decision panel shows (``DecisionView.state``), its label
    the panel's title."""

    PENDING = "pending", "Pending review"
    AWAITING_QUORUM = "awaiting_quorum", "Awaiting quorum"
    ISSUED = "issued", "Approved"
    DELIVERED = "delivered", "Token delivered"
    CONSUMED = "consumed", "Consumed"
    REJECTED = "rejected", "Rejected"
    REVOKED = "revoked", "Revoked"
    EXPIRED = "expired", "Expired"
    AUTO_ADMITTED = "auto_admitted", "Auto-admitted"
    TIMED_OUT = "timed_out", "Timed out"


class QueueReason(models.TextChoices):
    """Why an item is in the operators' queue: what a person must look at."""

    OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"
    INTERRUPTED = "interrupted", "Interrupted, waiting for credentials or a decision"
    EXPIRED_UNCLAIMED = "expired_unclaimed", "Approval expired unclaimed"
    STUCK_SENDING = "stuck_sending", "Stuck sending"
    STUCK_PENDING = "stuck_pending", "Stuck before dispatch"
    # An operator admitted another attempt at a command the runtime executes itself: the
    # runtime must run it again and report; nothing happens until it does.
    WAITING_FOR_RUNTIME = "waiting_for_runtime", "Waiting for the runtime"


# The order the queue's counts and its filter list the reasons in.
QUEUE_REASONS = (
    QueueReason.OUTCOME_UNKNOWN,
    QueueReason.INTERRUPTED,
    QueueReason.STUCK_SENDING,
    QueueReason.STUCK_PENDING,
    QueueReason.WAITING_FOR_RUNTIME,
    QueueReason.EXPIRED_UNCLAIMED,
)


# --- decisions a runtime is told of ------------------------------------------------------

# Audit kinds that are decisions on a runtime's request, and the word for each: the
# ``event`` of a push callback's body, and the ``decision`` label of the review metrics
# (which count the first two: ``REVIEW_DECISION_KINDS``).
DECISION_WORDS: dict[str, str] = {
    AuditKind.APPROVAL_ISSUED: "approved",
    AuditKind.OCCURRENCE_REJECTED: "rejected",
    AuditKind.APPROVAL_EXPIRED: "expired",
    AuditKind.PROPOSAL_EDITED: "edited",
    # An operator admitted a new attempt at a command the runtime executes (told only then:
    # a runtime that asked for its own epoch knows).
    AuditKind.EPOCH_ADMITTED: "attempt_admitted",
    AuditKind.OCCURRENCE_TIMED_OUT: "timed_out",
}
# A reviewer's decisions: the ones the review-time metric observes.
REVIEW_DECISION_KINDS = (AuditKind.APPROVAL_ISSUED, AuditKind.OCCURRENCE_REJECTED)
