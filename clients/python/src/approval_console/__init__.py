"""A client for the approval console's agent API.

``ApprovalConsole`` (sync) and ``AsyncApprovalConsole`` (async) speak the v1 API;
``approval_console.langgraph`` and ``approval_console.openai_agents`` adapt it to LangGraph
and the OpenAI Agents SDK, and ``approval_console.langchain`` backs LangChain's
human-in-the-loop middleware with it (optional extras). The execution-id convention is in
``approval_console.execution``.
"""

from approval_console import errors
from approval_console.client import (
    ApprovalConsole,
    AsyncApprovalConsole,
    RetryPolicy,
    parse_retry_after,
)
from approval_console.execution import client_ref_for, execution_id_for
from approval_console.models import (
    ApprovalState,
    CanonicalAction,
    ClaimResult,
    CommandDetail,
    CommandRef,
    Occurrence,
    PriorDecision,
    Proposal,
    Proposed,
    Token,
    ToolContract,
)

__all__ = [
    "ApprovalConsole",
    "ApprovalState",
    "AsyncApprovalConsole",
    "CanonicalAction",
    "ClaimResult",
    "CommandDetail",
    "CommandRef",
    "Occurrence",
    "PriorDecision",
    "Proposal",
    "Proposed",
    "RetryPolicy",
    "Token",
    "ToolContract",
    "client_ref_for",
    "errors",
    "execution_id_for",
    "parse_retry_after",
]
