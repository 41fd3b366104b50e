"""An occurrence's history table (its audit events, with the details people need) and the
evidence summary (claims approved, refused, redelivered)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from approvals.models import (
    AuditEvent,
)
from approvals.vocabulary import AuditKind, ClaimDecision, is_refused_use
from approvals.web.selectors.history import (
    DELIVERED,
    HISTORY_PAGE,
    ClaimTally,
    HistoryCursor,
    HistoryWindow,
)
from approvals.web.text import NO_HTML, reveal_html

# Claim decisions an investigator must not miss: each is a refused use of an approval.
SECURITY_DECISIONS: dict[str, str] = {
    ClaimDecision.REPLAYED: "Replay refused",
    ClaimDecision.SCOPE_MISMATCH: "Scope mismatch",
    ClaimDecision.UNKNOWN_TOKEN: "Unknown token",
    ClaimDecision.EXPIRED: "Expired token",
    ClaimDecision.REVOKED: "Revoked token",
}


OUTCOME_TEXT: dict[str, str] = {
    ClaimDecision.REPLAYED: "Another execution already used this approval; this one was refused.",
    ClaimDecision.SCOPE_MISMATCH: (
        "The claimed action is not the approved one; refused, token unused."
    ),
    ClaimDecision.UNKNOWN_TOKEN: "No such token in this tenant; refused.",
    ClaimDecision.EXPIRED: "The approval had expired; refused.",
    ClaimDecision.REVOKED: "The approval was revoked; refused.",
    ClaimDecision.DUPLICATE_DELIVERY: (
        "The same execution delivered its claim again (a queue redelivery): it got the "
        "existing command back; nothing ran twice."
    ),
}


_HISTORY_DETAIL_KEYS = [
    "version",
    "from_version",
    "to_version",
    "votes",
    "needed",
    "approvers",
    "expires_at",
    "epoch",
    "idempotency_key",
    "justification",
    "reason",
    "invocation",
    "kind",
    "receipt",
    "why",
    "detail",
    "challenges",
    "attempt",
    "retry_in_seconds",
    "previous_epoch",
    "basis",
    "adapter",
    "retired_fingerprint",
    "via",
]


def detail_value(value: Any) -> str:
    if isinstance(value, list):
        return "; ".join(detail_value(item) for item in value)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
        if moment.tzinfo is not None:
            return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")
        return value
    return str(value)


@dataclass(frozen=True)
class Detail:
    key: str
    value: SafeString  # agent or remote text (execution and message ids, receipts), revealed
    code: bool  # an identifier, shown in monospace and wrapped anywhere


@dataclass(frozen=True)
class HistoryRow:
    event: AuditEvent
    kind: SafeString  # the event kind, breakable only after its dots
    details: list[Detail]
    flag: str  # "security", "redelivery" or ""
    flag_label: str
    outcome: str  # the decision in words, or ""
    actor: SafeString = NO_HTML  # revealed; empty when the event names none


def history_row(event: AuditEvent) -> HistoryRow:
    data = event.data if isinstance(event.data, dict) else {}
    details = [
        Detail(
            key.replace("_", " "),
            reveal_html(detail_value(data[key])),
            code=key == "idempotency_key",
        )
        for key in _HISTORY_DETAIL_KEYS
        if key in data
    ]
    # Execution and message ids come from the runtime: a bidi control in one
    # ("run\u202egnp.exe" shows as "runexe.png") is shown as its escape, like agent text.
    if event.execution_id:
        details.append(Detail("execution", reveal_html(event.execution_id), code=True))
    if event.message_id:
        details.append(Detail("message", reveal_html(event.message_id), code=True))
    if event.command_id:
        details.append(Detail("command", reveal_html(str(event.command_id)), code=True))

    decision = event.decision
    flag = flag_label = outcome = ""
    if event.kind == AuditKind.APPROVAL_EXPIRED:
        outcome = "The approval expired unclaimed: its token can no longer be claimed."
    elif is_refused_use(event.kind, decision):
        flag = "security"
        if event.kind == AuditKind.APPROVAL_REVOKED:
            flag_label, outcome = "Approval revoked", "An admin revoked the approval."
        else:
            flag_label, outcome = SECURITY_DECISIONS[decision], OUTCOME_TEXT[decision]
    elif decision == ClaimDecision.DUPLICATE_DELIVERY:
        flag, flag_label = "redelivery", "Redelivery · healthy"
        outcome = OUTCOME_TEXT[decision]
    elif event.kind == AuditKind.DISPATCH_REDELIVERED:
        flag, flag_label = "redelivery", "Redelivery · healthy"
        outcome = (
            "The queue delivered the command again; its effect was settled, so nothing was called."
        )
    elif event.kind == AuditKind.TOKEN_REDELIVERED:
        flag, flag_label = "redelivery", "Re-delivery · same execution"
        outcome = (
            "The execution the token was delivered to asked again before claiming (it lost "
            "the token); it got a fresh one and the earlier token can no longer be claimed."
        )
    elif event.kind == AuditKind.EFFECT_REPORT_REFUSED:
        flag, flag_label = "security", "Report refused"
        outcome = "An execution that does not hold this command tried to report its effect."
    return HistoryRow(
        event,
        kind_html(event.kind),
        details,
        flag,
        flag_label,
        outcome,
        actor=reveal_html(event.actor or ""),
    )


@functools.lru_cache(maxsize=512)
def kind_html(kind: str) -> SafeString:
    """An audit kind as the history shows it, in inline blocks, so that a narrow column
    breaks a kind only after its dots (a <wbr> would also break where the column is wide
    enough: Chromium ignores nowrap for it). Kinds are few (other producers' included), and
    a page shows the same ones dozens of times: each is built once per process."""
    parts = kind.split(".")
    return format_html_join(
        "",
        '<span class="kind-part">{}</span>',
        ((part + ("." if n < len(parts) - 1 else ""),) for n, part in enumerate(parts)),
    )


def history_rows(events: Iterable[AuditEvent]) -> list[HistoryRow]:
    return [history_row(event) for event in events]


@dataclass(frozen=True)
class EvidencePart:
    text: str  # "2 deliveries of execution"
    names: list[str] = field(default_factory=list)  # agent-supplied execution ids
    in_parentheses: bool = False
    alarm: bool = False
    more: int = 0  # executions not named

    @property
    def more_text(self) -> str:
        return f"{self.more:,}"

    @property
    def names_html(self) -> list[SafeString]:
        """The execution ids as the page shows them: hidden characters as escapes."""
        return [reveal_html(name) for name in self.names]


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def evidence_parts(tally: ClaimTally) -> list[EvidencePart]:
    """One line telling a redelivery from a replay, from the occurrence's claim events:
    ``1 command · 2 deliveries of execution worker-a · 1 replay refused (worker-b)``."""
    approved = tally.by_decision.get(ClaimDecision.APPROVED, 0)
    parts = [EvidencePart(_plural(tally.commands, "command", "commands"), alarm=tally.commands > 1)]
    if approved > 1:
        parts.append(EvidencePart(f"{approved:,} approved claims: control failure", alarm=True))
    for execution, count in tally.deliveries:
        parts.append(
            EvidencePart(
                _plural(count, "delivery of execution", "deliveries of execution"),
                names=[execution],
            )
        )
    unnamed = sum(tally.by_decision.get(d, 0) for d in DELIVERED) - sum(
        count for _, count in tally.deliveries
    )
    if unnamed > 0:
        parts.append(
            EvidencePart(
                _plural(
                    unnamed,
                    "more delivery of other executions",
                    "more deliveries of other executions",
                )
            )
        )
    replays = tally.by_decision.get(ClaimDecision.REPLAYED, 0)
    if replays:
        parts.append(
            EvidencePart(
                _plural(replays, "replay refused", "replays refused"),
                names=tally.replayers,
                in_parentheses=True,
                alarm=True,
                more=tally.replayer_total - len(tally.replayers),
            )
        )
    else:
        parts.append(EvidencePart("no replay attempts"))
    for decision, count in tally.by_decision.items():
        if decision in SECURITY_DECISIONS and decision != ClaimDecision.REPLAYED:
            label = SECURITY_DECISIONS[decision].lower()
            parts.append(
                EvidencePart(_plural(count, f"claim refused: {label}", f"claims refused: {label}"))
            )
    return parts


def evidence_text(parts: Iterable[EvidencePart]) -> str:
    """The summary as plain text, as the page reads it out."""
    out = []
    for part in parts:
        text = part.text
        if part.names:
            names = ", ".join(part.names)
            if part.more:
                names += f" and {part.more_text} more"
            text += f" ({names})" if part.in_parentheses else f" {names}"
        out.append(text)
    return " · ".join(out)


def history_caption(window: HistoryWindow) -> str:
    shown, total = len(window.events), window.total
    if total <= shown:
        return f"{_plural(shown, 'event', 'events')}, oldest first"
    if not shown:
        return f"no events here of {total:,}"
    if window.latest:
        return f"latest {shown:,} of {total:,} events, oldest first"
    first = window.earlier + 1
    return f"events {first:,} to {first + shown - 1:,} of {total:,}, oldest first"


@dataclass(frozen=True)
class HistoryLink:
    id: str  # stable across the panel poll's swap of the history, so focus stays on it
    text: str
    url: str
    rel: str = ""


def history_links(
    occurrence_id: Any, window: HistoryWindow, *, page: str = ""
) -> list[HistoryLink]:
    """The history's pager: earlier and later windows by keyset cursor (the ids of the
    first and last events shown), and the two ends, so that every event can be reached.
    ``page`` is where the links lead, with its fragment (by default the review page's
    ``#history``; the operations timeline pages the same events)."""
    events = window.events
    if window.earlier == 0 and window.later == 0:
        return []
    path, _, fragment = (
        page or f"{reverse('approvals:review', args=[occurrence_id])}#history"
    ).partition("#")

    def link(name: str, text: str, cursor: HistoryCursor, rel: str = "") -> HistoryLink:
        query = urlencode(cursor.query)
        url = f"{path}?{query}" if query else path
        return HistoryLink(f"history-{name}", text, f"{url}#{fragment}" if fragment else url, rel)

    oldest, latest = HistoryCursor(after=0), HistoryCursor()
    if not events:  # a cursor past either end
        return [link("oldest", "Oldest events", oldest), link("latest", "Latest events", latest)]
    size = HISTORY_PAGE
    links = []
    if window.earlier > size:
        links.append(link("oldest", "Oldest events", oldest))
    if window.earlier:
        earlier = HistoryCursor(before=events[0].pk)
        links.append(link("earlier", "← Earlier events", earlier, "prev"))
    if window.later:
        later = HistoryCursor(after=events[-1].pk)
        links.append(link("later", "Later events →", later, "next"))
    if window.later > size:
        links.append(link("latest", "Latest events", latest))
    return links
