"""The effect of a consumed approval in one or two words, beside the decision: a reviewer
reads "Consumed · outcome unknown", not "Consumed" alone, wherever the approval is shown."""

from __future__ import annotations

from approvals.models import Command

# The word for each command state; ``interrupted`` is a rejected call that an
# authentication challenge stopped (its recovery waits for an admin).
EFFECT_WORDS = {
    Command.State.PENDING: "not sent",
    Command.State.SENDING: "sending",
    Command.State.COMMITTED: "committed",
    Command.State.REJECTED: "rejected",
    Command.State.OUTCOME_UNKNOWN: "outcome unknown",
    Command.State.RECONCILED: "reconciled",
    Command.State.COMPENSATED: "compensated",
}
INTERRUPTED = "interrupted"


def effect_word(state: str, *, interrupted: bool = False) -> str:
    """``committed``, ``rejected``, ``interrupted``, ``outcome unknown``, ``not sent``..."""
    if state == Command.State.REJECTED and interrupted:
        return INTERRUPTED
    return EFFECT_WORDS.get(Command.State(state), state) if state in Command.State else state


def effect_badge(state: str, *, interrupted: bool = False) -> str:
    """The badge modifier of an effect: ``command-<state>``, or ``reason-interrupted``."""
    if state == Command.State.REJECTED and interrupted:
        return "reason-interrupted"
    return f"command-{state}"
