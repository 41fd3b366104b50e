"""The inbox's rows: what was asked, by whom, how long ago, and its state at a glance."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from approvals.models import (
    Approval,
    Occurrence,
)
from approvals.reviews.selectors import approval_state
from approvals.web.forms import STATE_ALL, STATE_CHOICES, STATE_WENT_WRONG
from approvals.web.links import occurrence_path
from approvals.web.money import MoneyLine, money_lines
from approvals.web.presenters.effects import effect_badge, effect_word
from approvals.web.selectors.inbox import InboxFreshness
from approvals.web.shell import age, stamp
from approvals.web.text import ArgumentFlag, argument_flags, json_value, reveal_html

INBOX_POLL_SECONDS = 5


def argument_summary(arguments: dict[str, Any], limit: int = 110) -> SafeString:
    """``key=value, ...`` on one line, cut at ``limit`` characters, hidden characters shown."""
    text = ", ".join(f"{k}={json_value(v)}" for k, v in arguments.items())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return reveal_html(text)


def inbox_badge(occurrence: Occurrence, now: datetime) -> tuple[str, str]:
    """An inbox row's badge: the occurrence's status, refined by its votes and approval."""
    status = occurrence.status
    approvals = getattr(occurrence, "current_approvals", [])
    if status == Occurrence.Status.APPROVED and approvals:
        approval = approvals[0]
        if approval_state(approval, now) == Approval.State.EXPIRED:
            return "expired", "Expired"
        if approval.delivered_at:
            return "delivered", "Token delivered"
    if status == Occurrence.Status.CLAIMED and approvals:
        # Beside the decision, what the effect came to: "Consumed" alone hid a failure.
        command_state = getattr(approvals[0], "command_state", None)
        if command_state:
            interrupted = bool(getattr(approvals[0], "interrupted", False))
            word = effect_word(command_state, interrupted=interrupted)
            return effect_badge(command_state, interrupted=interrupted), (
                f"{Occurrence.Status.CLAIMED.label} · {word}"
            )
    proposals = getattr(occurrence, "current_proposals", [])
    votes = getattr(proposals[0], "votes_count", 0) if proposals else 0
    if status == Occurrence.Status.PENDING_REVIEW and votes:
        needed = occurrence.tool.approvals_needed(proposals[0].arguments)
        return "awaiting_quorum", f"{votes} of {needed} approval{'' if needed == 1 else 's'}"
    badge = "pending" if status == Occurrence.Status.PENDING_REVIEW else status
    return badge, Occurrence.Status(status).label


def escalated_badge(occurrence: Occurrence, now: datetime) -> str:
    """ "Escalated: waiting 35 min" for a pending row past its review deadline, else ""."""
    if occurrence.escalated_at is None or occurrence.status != Occurrence.Status.PENDING_REVIEW:
        return ""
    minutes = max(int((now - occurrence.created_at).total_seconds() // 60), 0)
    return f"Escalated: waiting {minutes} min"


@dataclass(frozen=True)
class InboxRow:
    occurrence: Occurrence
    summary: SafeString
    money: list[MoneyLine]
    requested_by: SafeString
    run_id: SafeString
    badge: str
    label: str
    age: str
    escalated: str = ""  # past the review deadline, still pending
    routed: bool = False  # a routing rule asks the reader to review it (listed first)
    flags: list[ArgumentFlag] = field(default_factory=list)  # look-alike text

    @property
    def flags_text(self) -> str:
        return " · ".join(flag.text for flag in self.flags)

    @property
    def flag_paths(self) -> list[str]:
        """The flagged arguments' paths, a path flagged twice in a row named once."""
        paths: list[str] = []
        for flag in self.flags:
            if not paths or paths[-1] != flag.path:
                paths.append(flag.path)
        return paths

    @property
    def href(self) -> str:
        return occurrence_path("approvals:review", self.occurrence.pk)


def inbox_row(occurrence: Occurrence, now: datetime) -> InboxRow:
    """One row, from an occurrence loaded by ``approvals.web.selectors.inbox.inbox_page``
    (its ``routed_first`` says a rule routes it to the reader)."""
    proposals = getattr(occurrence, "current_proposals", [])
    arguments = proposals[0].arguments if proposals else {}
    badge, label = inbox_badge(occurrence, now)
    return InboxRow(
        occurrence=occurrence,
        summary=argument_summary(arguments) if proposals else SafeString(""),
        money=money_lines(arguments),
        requested_by=reveal_html(occurrence.requested_by),
        run_id=reveal_html(occurrence.run_id),
        badge=badge,
        label=label,
        age=age(occurrence.created_at, now),
        escalated=escalated_badge(occurrence, now),
        routed=bool(getattr(occurrence, "routed_first", False)),
        flags=argument_flags(arguments),
    )


def inbox_stamp(
    fresh: InboxFreshness,
    *,
    tenant_ids: list[int],
    tool: str,
    state: str,
    page: int,
    now: datetime,
    narrowing: dict[str, str] | None = None,
    routing: tuple[object, ...] = (),
) -> str:
    """The inbox list's stamp, from what ``approvals.web.selectors.inbox.inbox_total`` and
    ``approvals.web.selectors.inbox.inbox_last_event`` read, without the rows. The minute is part of
    it because the rows' ages and an approval's expiry change with the clock; ``routing``
    (the rule versions that route to the reader, read by the count's statement) because the
    reader joining or leaving a group reorders the list and changes its badges."""
    minute = now.replace(second=0, microsecond=0)
    parts: list[object] = [
        tenant_ids,
        tool,
        state,
        page,
        fresh.total,
        fresh.last_change,
        fresh.last_event_id,
        minute,
    ]
    if narrowing:  # the requester, run and amount filters (the stamp without them unchanged)
        parts.append(sorted(narrowing.items()))
    if any(routing):  # the stamp of a reader no rule routes to unchanged
        parts.append(routing)
    return stamp(parts)


def inbox_list(
    occurrences: Iterable[Occurrence],
    *,
    tool: str,
    state: str,
    page: int,
    total: int,
    rendered: str,
    narrowing: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What the inbox list shows; ``rendered`` is the stamp its poll sends back;
    ``narrowing`` the requester, run and amount filters, kept in its links."""
    now = timezone.now()
    rows = [inbox_row(occurrence, now) for occurrence in occurrences]
    filters = {"tool": tool, "state": state, **(narrowing or {})}
    state_label = dict(STATE_CHOICES)[state]
    counted = "requests in all states" if state == STATE_ALL else state_label.lower()
    if state == STATE_WENT_WRONG:
        counted = "of my approvals went wrong"
    poll_query = urlencode({**filters, "page": page, "rendered": rendered})
    return {
        "tool": tool,
        "state": state,
        "state_label": state_label,
        "state_choices": STATE_CHOICES,
        "rows": rows,
        "stamp": rendered,
        "query": urlencode(filters),
        "poll_url": f"{reverse('approvals:inbox')}?{poll_query}",
        "poll_seconds": INBOX_POLL_SECONDS,
        "announce": f"{total} {counted}",
    }
