"""Which operator decisions a command allows: one table, read by the timeline for the forms
it offers and by ``reconciliation.operator_actions`` for what it refuses, so that a page
never offers a decision the server then refuses (a Retry after "reconciled as committed"
was both offered and refused before the two read different rules)."""

from __future__ import annotations

from approvals.models import Command
from reconciliation import adapters
from reconciliation.models import OperatorDecision

Finding = OperatorDecision.Finding

# Where each action may start from. A state outside its set means another operator (or the
# worker) got there first: the action is refused and the page shows the new state.
ALLOWED_FROM: dict[str, tuple[str, ...]] = {
    OperatorDecision.Action.QUERY_EFFECT: (
        Command.State.OUTCOME_UNKNOWN,
        Command.State.SENDING,
        Command.State.PENDING,
        Command.State.REJECTED,
    ),
    OperatorDecision.Action.RECONCILE: (
        Command.State.OUTCOME_UNKNOWN,
        Command.State.SENDING,
        Command.State.PENDING,
    ),
    OperatorDecision.Action.ACCEPT_AMBIGUITY: (
        Command.State.OUTCOME_UNKNOWN,
        Command.State.SENDING,
    ),
    OperatorDecision.Action.RETRY: (
        Command.State.PENDING,
        Command.State.REJECTED,
        Command.State.RECONCILED,
    ),
    OperatorDecision.Action.COMPENSATE: (Command.State.COMMITTED, Command.State.RECONCILED),
}

# A reconciled effect allows what its finding established, and only that: a retry of an
# effect found not committed, a compensation of one found committed.
NEEDS_FINDING: dict[str, tuple[str, str]] = {
    OperatorDecision.Action.RETRY: (
        Finding.NOT_COMMITTED,
        "The effect was reconciled as committed: a retry would duplicate it.",
    ),
    OperatorDecision.Action.COMPENSATE: (
        Finding.COMMITTED,
        "The effect was reconciled as not committed: there is nothing to compensate.",
    ),
}

# The order the timeline offers them in: find out first, then record, then act.
ORDER = (
    OperatorDecision.Action.QUERY_EFFECT,
    OperatorDecision.Action.RECONCILE,
    OperatorDecision.Action.ACCEPT_AMBIGUITY,
    OperatorDecision.Action.RETRY,
    OperatorDecision.Action.COMPENSATE,
)


def state_allows(action: str, state: str) -> bool:
    return state in ALLOWED_FROM[action]


def finding_refusal(action: str, *, state: str, finding: str) -> str:
    """Why a reconciled effect's finding does not allow the action ("" when it does)."""
    needed = NEEDS_FINDING.get(action)
    if state == Command.State.RECONCILED and needed is not None and finding != needed[0]:
        return needed[1]
    return ""


def why_not(action: str, *, state: str, finding: str, adapter: str) -> str:
    """Why the action is not open to an operator now, in one sentence; "" when it is."""
    if not state_allows(action, state):
        return f"Not while the effect is {Command.State(state).label.lower()}."
    refusal = finding_refusal(action, state=state, finding=finding)
    if refusal:
        return refusal
    if action == OperatorDecision.Action.QUERY_EFFECT and not adapters.can_query(adapter):
        return "This tool's adapter cannot be asked whether an effect exists."
    return ""


def allowed_actions(*, state: str, finding: str, adapter: str) -> list[str]:
    """The decisions open now, in the order the timeline offers them."""
    return [a for a in ORDER if not why_not(a, state=state, finding=finding, adapter=adapter)]
