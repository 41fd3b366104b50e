"""Execution authority: who may act, on exactly which action, and how often.

One module per subject; every model is importable from ``approvals.models``, as Django
expects of an app's models.
"""

from approvals.models.audit import (
    AUDIT_CHAIN_GENESIS,
    DECISIVE_EVENTS,
    AuditChainHead,
    AuditDuplicateDelivery,
    AuditEvent,
    AuditIngestion,
    chain_canonical,
    stored_time_text,
)
from approvals.models.callbacks import CallbackAttempt, CallbackDelivery, RuntimeCallback
from approvals.models.contracts import ToolContract
from approvals.models.notifications import (
    Channel,
    NotificationAttempt,
    NotificationDelivery,
    NotificationEvent,
    NotificationPreference,
)
from approvals.models.occurrences import (
    Approval,
    ApprovalVote,
    Command,
    Epoch,
    Occurrence,
    Proposal,
    RetiredToken,
)
from approvals.models.routing import ReviewerGroup, RoutingRule, RoutingRuleVersion
from approvals.models.tenancy import (
    Membership,
    ReviewerToken,
    ReviewerTokenUsage,
    RuntimeKey,
    RuntimeKeyUsage,
    Tenant,
)

__all__ = [
    "AUDIT_CHAIN_GENESIS",
    "DECISIVE_EVENTS",
    "Approval",
    "ApprovalVote",
    "AuditChainHead",
    "AuditDuplicateDelivery",
    "AuditEvent",
    "AuditIngestion",
    "CallbackAttempt",
    "CallbackDelivery",
    "Channel",
    "Command",
    "Epoch",
    "Membership",
    "NotificationAttempt",
    "NotificationDelivery",
    "NotificationEvent",
    "NotificationPreference",
    "Occurrence",
    "Proposal",
    "RetiredToken",
    "ReviewerGroup",
    "ReviewerToken",
    "ReviewerTokenUsage",
    "RoutingRule",
    "RoutingRuleVersion",
    "RuntimeCallback",
    "RuntimeKey",
    "RuntimeKeyUsage",
    "Tenant",
    "ToolContract",
    "chain_canonical",
    "stored_time_text",
]
