"""What an adapter's typed result says, in the invocation row's terms: its outcome, the
detail it keeps, and the result in words for a late answer."""

from __future__ import annotations

from typing import Any

from reconciliation.adapters.base import Committed, Interrupted, NotFound, Rejected, Unknown
from reconciliation.models import AdapterInvocation


def outcome_of(result: Any) -> str:
    """The invocation outcome an adapter's typed result records."""
    return {
        Committed: AdapterInvocation.Outcome.COMMITTED,
        Rejected: AdapterInvocation.Outcome.REJECTED,
        Unknown: AdapterInvocation.Outcome.OUTCOME_UNKNOWN,
        Interrupted: AdapterInvocation.Outcome.INTERRUPTED,
        NotFound: AdapterInvocation.Outcome.NOT_FOUND,
    }[type(result)].value


def describe(result: Any) -> str:
    """An adapter's typed result in words, for a late answer's detail."""
    if isinstance(result, Committed):
        return f"committed, receipt {result.receipt}"
    if isinstance(result, Rejected):
        return f"rejected: {result.reason}"
    if isinstance(result, Interrupted):
        return f"interrupted: {result.detail}"
    if isinstance(result, NotFound):
        return "no effect found"
    return f"unknown: {result.why}"


def detail_of(result: Any) -> str:
    """The detail an invocation row keeps of a result."""
    if isinstance(result, Rejected):
        return result.reason
    if isinstance(result, Unknown):
        return result.why
    detail: str = result.detail
    return detail
