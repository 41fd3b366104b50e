"""What a notification says about a request, built once per event: never a token, never
an argument the contract marks sensitive."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.urls import reverse

from approvals.access.requester import requester_marks
from approvals.canonical.money import currency_exponent
from approvals.models import NotificationEvent, Occurrence, Proposal
from approvals.routing.rules import request_money

# Arguments shown in a message: the first few, each cut short.
SHOWN_ARGUMENTS = 8
SHOWN_CHARS = 80


def money_text(amount_minor: int, currency: str) -> str:
    """``8000, "EUR"`` -> ``"EUR 80.00"`` (integer arithmetic; an unknown code as is)."""
    digits = currency_exponent(currency)
    if digits is None:
        return f"{currency} {amount_minor} (minor units)"
    sign = "-" if amount_minor < 0 else ""
    whole, fraction = divmod(abs(amount_minor), 10**digits)
    return f"{currency} {sign}{whole:,}" + (f".{fraction:0{digits}d}" if digits else "")


def review_url(occurrence_id: uuid.UUID | str) -> str:
    """The review page, absolute (``CONSOLE_BASE_URL``): what a message links to."""
    path = reverse("approvals:review", args=[occurrence_id])
    return str(settings.CONSOLE_BASE_URL).rstrip("/") + path


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def message(
    event: NotificationEvent,
    occurrence: Occurrence | None = None,
    proposal: Proposal | None = None,
) -> dict[str, Any]:
    """The facts every channel words in its own way, as JSON-ready values. The fan-out
    passes the occurrence (with its tool and tenant) and its current proposal it read with
    the event; without them they are read here."""
    if occurrence is None:
        occurrence = Occurrence.objects.select_related("tool", "tenant").get(pk=event.occurrence_id)
        proposal = Proposal.objects.filter(occurrence=occurrence, is_current=True).first()
    arguments = proposal.arguments if proposal is not None else {}
    contract = occurrence.tool
    hidden = set(contract.sensitive_arguments or [])
    shown = [[name, _short(value)] for name, value in arguments.items() if name not in hidden][
        :SHOWN_ARGUMENTS
    ]
    requester = requester_marks(
        occurrence.requested_by, occurrence.tenant_id, occurrence.tenant.name
    )
    money = request_money(contract, arguments)
    amount = None
    if money is not None and contract.quorum_amount_argument not in hidden:
        amount = money_text(*money)
    return {
        "event": event.kind,
        "outcome": event.outcome,
        # A decision's who and, for a rejection, why (the reviewer's words, as the agent
        # gets them); empty otherwise.
        "decided_by": event.decided_by,
        "rejection_reason": _short(occurrence.rejection_reason)
        if event.kind == NotificationEvent.Kind.DECIDED and occurrence.rejection_reason
        else "",
        "occurrence_id": str(occurrence.pk),
        "tenant": occurrence.tenant.name,
        "tool": contract.name,
        "summary": f"{contract.name} requested by {requester['shown'] or 'the agent'}",
        "requested_by": occurrence.requested_by,
        "requester": requester,
        "reason": _short(occurrence.reason) if occurrence.reason else "",
        "amount": amount,
        "arguments": shown,
        "withheld": len([n for n in arguments if n in hidden]),
        "digest_prefix": proposal.action_digest[:12] if proposal is not None else "",
        "version": proposal.version if proposal is not None else None,
        "link": review_url(occurrence.pk),
        "created_at": occurrence.created_at.isoformat(),
    }


def headline(body: dict[str, Any]) -> str:
    """One line: what happened to which request."""
    what = {
        NotificationEvent.Kind.REQUESTED: "Review requested",
        NotificationEvent.Kind.ESCALATED: "Escalated, nobody decided in time",
        NotificationEvent.Kind.DECIDED: f"Decided: {body.get('outcome', '')}",
    }.get(body.get("event", ""), "Request")
    amount = f" · {body['amount']}" if body.get("amount") else ""
    return f"{what}: {body.get('tool', '')}{amount}"
