"""How the console shows what it stores: plain functions and dataclasses that turn rows
already read into what a page displays. No requests, no queries, so each is testable alone.

Everything an agent wrote passes through ``reveal`` (escaped, hidden characters shown) or
is left to the template's autoescaping; nothing here marks agent text safe unescaped.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import unicodedata
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

from approvals.canonical.confusables import LookAlike, is_hidden, look_alikes, same_person
from approvals.canonical.form import pretty
from approvals.canonical.money import currency_exponent, is_amount
from approvals.forms import STATE_ALL, STATE_CHOICES
from approvals.models import (
    Approval,
    AuditEvent,
    Command,
    Occurrence,
    Proposal,
    ToolContract,
)
from approvals.reviews.selectors import approval_state, effective_approval_state
from approvals.selectors import (
    DELIVERED,
    HISTORY_PAGE,
    ClaimTally,
    DecisionView,
    EffectEvidence,
    Freshness,
    HistoryCursor,
    HistoryWindow,
    InboxFreshness,
    PanelState,
    ReviewSnapshot,
    tenant_members,
)
from approvals.vocabulary import AuditKind, ClaimDecision, is_refused_use

PANEL_POLL_SECONDS = 2
INBOX_POLL_SECONDS = 5


def stamp(parts: Any) -> str:
    """A short name for what a polled fragment shows; equal names mean nothing changed."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


# --- showing agent-supplied text ------------------------------------------------------

# Characters that render as nothing, as a space, or that reorder the text around them
# (bidi controls, ``canonical.is_hidden``): a reviewer could not see them, so they are
# shown as JSON escapes.


def json_escape(char: str) -> str:
    """``char`` as JSON writes it escaped: ``\\uXXXX``, or a surrogate pair above U+FFFF."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


NO_HTML = SafeString("")


@dataclass(frozen=True)
class Revealed:
    html: SafeString
    hidden: int


def reveal(text: str, look_alike: Collection[str] = ()) -> Revealed:
    """Escaped HTML of ``text`` with hidden characters shown as highlighted ``\\uXXXX``,
    and the characters in ``look_alike`` (from ``argument_flags``) highlighted as they are.

    In JSON, every non-ASCII character sits inside a string, where ``\\uXXXX`` denotes the
    same character: the revealed text still parses to the exact digested value.
    """
    if not look_alike and text.isascii() and text.isprintable():
        # Printable ASCII hides nothing (no control, format or odd space character): the
        # common case, most of an audit history's ids and names, without the loop below.
        # Django's escape() is exactly this, behind a lazy-string wrapper that costs more
        # than the escaping; a history page calls this hundreds of times.
        return Revealed(SafeString(html.escape(text)), 0)
    pieces: list[SafeString] = []
    hidden = 0
    run = ""
    for char in text:
        if not is_hidden(char) and char not in look_alike:
            run += char
            continue
        if run:
            pieces.append(format_html("{}", run))
            run = ""
        if char in look_alike:
            pieces.append(
                format_html(
                    '<mark class="hidden-char lookalike-char" title="Look-alike character {}">'
                    "{}</mark>",
                    f"U+{ord(char):04X} {unicodedata.name(char, '')}".strip(),
                    char,
                )
            )
            continue
        hidden += 1
        pieces.append(
            format_html(
                '<mark class="hidden-char" title="Invisible character U+{}">{}</mark>',
                f"{ord(char):04X}",
                json_escape(char),
            )
        )
    if run:
        pieces.append(format_html("{}", run))
    return Revealed(format_html_join("", "{}", ((piece,) for piece in pieces)), hidden)


def reveal_html(text: str) -> SafeString:
    return reveal(text).html


def plain_reveal(text: str) -> str:
    """``text`` with hidden characters as ``\\uXXXX``, for a textarea."""
    return "".join(json_escape(c) if is_hidden(c) and ord(c) > 0x7F else c for c in text)


def json_value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --- money ------------------------------------------------------------------------------

_MINOR_SUFFIX = "_minor"
_MAX_MONEY_LINES = 20


def minor_units(currency: str) -> int | None:
    """Digits after the decimal point in ``currency``, from ISO 4217 (the ``iso4217``
    package's copy of the maintenance agency's list), or None for a code that is no
    currency money is paid in (XXX, XTS, XAU, funds, anything unlisted)."""
    return currency_exponent(currency)


def format_money(amount_minor: int, currency: str) -> str:
    """``8000, "EUR"`` -> ``"EUR 80.00"``; ``12000, "JPY"`` -> ``"JPY 12,000"``.

    Integer arithmetic only: the amount is shown exactly, never rounded through a float.
    A code that is not an ISO 4217 currency is a ValueError: it is never shown as money.
    """
    digits = minor_units(currency)
    if digits is None:
        raise ValueError(f"{currency!r} is not an ISO 4217 currency.")
    sign = "-" if amount_minor < 0 else ""
    whole, fraction = divmod(abs(amount_minor), 10**digits)
    text = f"{whole:,}"
    if digits:
        text += f".{fraction:0{digits}d}"
    return f"{currency} {sign}{text}"


@dataclass(frozen=True)
class MoneyLine:
    """One amount read for a person: which argument it comes from and what it says."""

    label: SafeString  # "Amount"; keys come from the agent, so hidden characters are shown
    path: SafeString  # "amount_minor", or "lines[0].amount_minor" inside nested values
    amount_minor: int
    currency: str
    text: str  # "EUR 80.00"


_is_amount = is_amount


def _label(key: str) -> str:
    words = key.removesuffix(_MINOR_SUFFIX).replace("_", " ").strip()
    return words[:1].upper() + words[1:]


def _money_in(value: Any, path: str) -> Iterator[MoneyLine]:
    if isinstance(value, dict):
        currency = value.get("currency")
        if isinstance(currency, str) and minor_units(currency) is not None:
            for key, amount in value.items():
                if _is_amount(key, amount):
                    yield MoneyLine(
                        label=reveal_html(_label(key)),
                        path=reveal_html(f"{path}.{key}" if path else key),
                        amount_minor=amount,
                        currency=currency,
                        text=format_money(amount, currency),
                    )
        for key, nested in value.items():
            if isinstance(nested, dict | list):
                yield from _money_in(nested, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, nested in enumerate(value):
            yield from _money_in(nested, f"{path}[{index}]")


def money_lines(arguments: dict[str, Any]) -> list[MoneyLine]:
    """Every integer ``*_minor`` amount that has a ``currency`` code beside it.

    Only an ISO 4217 currency counts (not XXX, XTS, precious metals or funds); anything
    else is left as the JSON shows it rather than guessed at.
    """
    lines: list[MoneyLine] = []
    for line in _money_in(arguments, ""):
        lines.append(line)
        if len(lines) == _MAX_MONEY_LINES:
            break
    return lines


# --- look-alike text ----------------------------------------------------------------------

_MAX_FLAGS = 20


@dataclass(frozen=True)
class ArgumentFlag:
    """A string argument that is not what it looks like (Unicode TR39, ``look_alikes``)."""

    path: SafeString  # "payment_id", "lines[0].sku"; keys come from the agent
    word: SafeString  # the word as it is, hidden characters shown
    reads_as: SafeString  # what a reader would take it for
    reasons: list[str]
    path_text: str = ""  # the path as plain text, hidden characters as escapes

    @property
    def text(self) -> str:
        """One line, for a title attribute or a screen reader."""
        return f"{self.path_text}: {'; '.join(self.reasons)}"


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, nested in value.items():
            yield from _strings(nested, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, nested in enumerate(value):
            yield from _strings(nested, f"{path}[{index}]")


def _flag(path: str, found: LookAlike) -> ArgumentFlag:
    return ArgumentFlag(
        path=reveal_html(path),
        word=reveal_html(found.word),
        reads_as=reveal_html(found.reads_as),
        reasons=list(found.reasons),
        path_text=plain_reveal(path),
    )


def argument_flags(arguments: Any) -> list[ArgumentFlag]:
    """Every word of a string argument, at any depth, that mixes scripts or passes for
    other characters: ``"p\u0430y_42"`` (a Cyrillic a), ``"pay_\uff14\uff12"`` (fullwidth
    digits), ``"pay_4\u03022"`` (a combining circumflex) all read as ``pay_42``."""
    flags: list[ArgumentFlag] = []
    for path, text in _strings(arguments, ""):
        for found in look_alikes(text):
            flags.append(_flag(path, found))
            if len(flags) == _MAX_FLAGS:
                return flags
    return flags


# --- the inbox ---------------------------------------------------------------------------


def argument_summary(arguments: dict[str, Any], limit: int = 110) -> SafeString:
    """``key=value, ...`` on one line, cut at ``limit`` characters, hidden characters shown."""
    text = ", ".join(f"{k}={json_value(v)}" for k, v in arguments.items())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return reveal_html(text)


def age(then: datetime, now: datetime) -> str:
    if (now - then).total_seconds() < 60:
        return "just now"
    return timesince(then, now, depth=1) + " ago"


def inbox_badge(occurrence: Occurrence, now: datetime) -> tuple[str, str]:
    """An inbox row's badge: the occurrence's status, refined by its votes and approval."""
    status = occurrence.status
    approvals = getattr(occurrence, "current_approvals", [])
    if status == Occurrence.Status.APPROVED and approvals:
        approval = approvals[0]
        if approval_state(approval, now) == "expired":
            return "expired", "Expired"
        if approval.delivered_at:
            return "delivered", "Token delivered"
    proposals = getattr(occurrence, "current_proposals", [])
    votes = getattr(proposals[0], "votes_count", 0) if proposals else 0
    if status == Occurrence.Status.PENDING_REVIEW and votes:
        needed = occurrence.tool.approvals_needed(proposals[0].arguments)
        return "awaiting_quorum", f"{votes} of {needed} approval{'' if needed == 1 else 's'}"
    badge = "pending" if status == Occurrence.Status.PENDING_REVIEW else status
    return badge, Occurrence.Status(status).label


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
    flags: list[ArgumentFlag] = field(default_factory=list)  # look-alike text

    @property
    def flags_text(self) -> str:
        return " · ".join(flag.text for flag in self.flags)


def inbox_row(occurrence: Occurrence, now: datetime) -> InboxRow:
    """One row, from an occurrence loaded by ``selectors.inbox_page``."""
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
        flags=argument_flags(arguments),
    )


def inbox_stamp(
    fresh: InboxFreshness, *, tenant_ids: list[int], tool: str, state: str, page: int, now: datetime
) -> str:
    """The inbox list's stamp, from what ``selectors.inbox_total`` and
    ``selectors.inbox_last_event`` read, without the rows. The minute is part of it
    because the rows' ages and an approval's expiry change with the clock."""
    minute = now.replace(second=0, microsecond=0)
    return stamp(
        [tenant_ids, tool, state, page, fresh.total, fresh.last_change, fresh.last_event_id, minute]
    )


def inbox_list(
    occurrences: Iterable[Occurrence],
    *,
    tool: str,
    state: str,
    page: int,
    total: int,
    rendered: str,
) -> dict[str, Any]:
    """What the inbox list shows; ``rendered`` is the stamp its poll sends back."""
    now = timezone.now()
    rows = [inbox_row(occurrence, now) for occurrence in occurrences]
    filters = {"tool": tool, "state": state}
    state_label = dict(STATE_CHOICES)[state]
    counted = "requests in all states" if state == STATE_ALL else state_label.lower()
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


# --- the history table ------------------------------------------------------------------

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


# --- evidence summary ---------------------------------------------------------------------


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


# --- labels -------------------------------------------------------------------------------

PANEL_LABELS = {
    PanelState.PENDING: "Pending review",
    PanelState.AWAITING_QUORUM: "Awaiting quorum",
    PanelState.ISSUED: "Approved",
    PanelState.DELIVERED: "Token delivered",
    PanelState.CONSUMED: "Consumed",
    PanelState.REJECTED: "Rejected",
    PanelState.REVOKED: "Revoked",
    PanelState.EXPIRED: "Expired",
    PanelState.AUTO_ADMITTED: "Auto-admitted",
}

REPLAY_SAFETY_HELP = {
    ToolContract.ReplaySafety.READ_ONLY: "changes nothing; may be repeated",
    ToolContract.ReplaySafety.IDEMPOTENT_WITH_KEY: "a repeat with the same key has no new effect",
    ToolContract.ReplaySafety.EFFECT_QUERYABLE: "its effect can be looked up before a retry",
    ToolContract.ReplaySafety.UNSAFE: "never repeated without an explicit decision",
}

# Refusals a reviewer can meet, said in the console's words.
REFUSALS = {
    "not_pending": "Another decision was recorded first; this is the current state.",
    "not_editable": "This request can no longer be edited: it is no longer pending or unclaimed.",
}


@dataclass(frozen=True)
class Notice:
    level: str  # success, info, warning, error
    text: str


def refusal(code: str, message: str) -> Notice:
    """A refused decision in the console's words. Losing a race to another reviewer is
    news, not an error: the request was decided, just not by this reviewer."""
    return Notice("info" if code == "not_pending" else "error", REFUSALS.get(code, message))


def _threshold_money(amount_minor: int, currency: str) -> str:
    if minor_units(currency) is None:
        return f"{amount_minor} {currency}"
    return format_money(amount_minor, currency)


def quorum_rule(tool: ToolContract, arguments: dict[str, Any] | None = None) -> str:
    """The tool's approval rule in words, with the threshold that applies to this call's
    currency (a per-currency contract) or the currency-blind one."""
    arguments = arguments or {}
    needed = f"{tool.approvals_required} distinct reviewers"
    if tool.approvals_required == 1:
        return "1 reviewer"
    if not tool.quorum_amount_argument:
        return needed
    amount = tool.quorum_amount_argument
    if tool.quorum_currency_argument:
        thresholds = tool.quorum_thresholds_minor or {}
        listed = ", ".join(
            _threshold_money(value, code) for code, value in sorted(thresholds.items())
        )
        currency = arguments.get(tool.quorum_currency_argument)
        threshold = tool.quorum_threshold(arguments)
        if isinstance(currency, str) and threshold is not None:
            this_call = f"{_threshold_money(threshold, currency)} for this call's currency"
        elif isinstance(currency, str):
            this_call = f"none for {json_value(currency)}, so this call needs the quorum"
        else:
            this_call = ""
        return (
            f"{needed} when {amount} is above the threshold of its currency"
            f"{f' ({this_call})' if this_call else ''}, or its currency has no threshold; "
            f"otherwise 1. Thresholds: {listed or 'none'}"
        )
    if tool.quorum_threshold_minor is None:
        return needed
    return f"{needed} when {amount} is above {tool.quorum_threshold_minor}; otherwise 1"


def duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} minute{'' if minutes == 1 else 's'}"
    return f"{minutes // 60} hours" + (f" {minutes % 60} minutes" if minutes % 60 else "")


# --- the review page ----------------------------------------------------------------------


@dataclass(frozen=True)
class Viewer:
    """Who looks at a review page, and what their roles in its tenant let them do."""

    username: str
    is_reviewer: bool
    is_admin: bool
    email: str = ""


@dataclass(frozen=True)
class EffectView:
    """What the panel says about a command's effect, in words."""

    state: str
    label: str
    headline: str
    # From the remote or the runtime: revealed, like agent text.
    receipt: SafeString
    why: SafeString
    challenges: list[SafeString]
    invocations: int
    epoch: int
    attention: bool  # someone must act: an unknown outcome, or a challenge to answer


def effect_view(command: Command, evidence: EffectEvidence | None) -> EffectView:
    """The effect of ``command`` as the newest evidence tells it."""
    latest = evidence.latest if evidence else None
    data = latest.data if latest is not None and isinstance(latest.data, dict) else {}
    why = str(data.get("why") or data.get("detail") or "")
    receipt = str(data.get("receipt") or "")
    interruption = evidence.interruption if evidence else None
    challenges: list[str] = []
    if interruption is not None and isinstance(interruption.data, dict):
        challenges = [str(c) for c in interruption.data.get("challenges", [])]
    state = command.state
    runtime = command.executed_by == Command.ExecutedBy.RUNTIME
    attention = False
    if (
        state == Command.State.PENDING
        and latest is not None
        and latest.kind == AuditKind.EFFECT_RETRY_SCHEDULED
    ):
        headline = (
            f"Refused before execution; the console calls again in "
            f"{data.get('retry_in_seconds', '?')} s (call {data.get('attempt', '?')} of "
            f"{data.get('of', '?')} was refused)."
        )
    elif state == Command.State.PENDING and runtime:
        headline = "Waiting for the runtime to execute it and report the effect."
    elif state == Command.State.PENDING:
        headline = "Queued: the console will deliver it to the adapter."
    elif state == Command.State.SENDING:
        headline = "Sending: a call to the adapter may be in flight."
    elif state == Command.State.COMMITTED:
        headline = "Committed: the remote did it."
    elif state == Command.State.REJECTED and challenges:
        attention = True
        headline = (
            "Interrupted: the remote asked for authentication and refused the call before "
            "executing it. Nothing is sent again until an admin replaces the credential; "
            "then a new epoch is admitted, because the effect is known rejected."
        )
    elif state == Command.State.REJECTED:
        headline = "Rejected: the remote refused it before executing it."
    elif state == Command.State.OUTCOME_UNKNOWN:
        attention = True
        headline = (
            "Outcome unknown: the call may or may not have taken effect. Nothing is called "
            "again until an operator reconciles it."
        )
    else:
        headline = command.get_state_display()
    return EffectView(
        state=state,
        label=command.get_state_display(),
        headline=headline,
        receipt=reveal_html(receipt),
        why=reveal_html(why),
        challenges=[reveal_html(c) for c in challenges],
        invocations=evidence.invocations if evidence else 0,
        epoch=evidence.epoch if evidence else 1,
        attention=attention,
    )


@dataclass(frozen=True)
class DecisionPanel:
    """Everything the decision panel shows, and the stamp its poll compares."""

    occurrence: Occurrence
    decision: DecisionView
    proposal: Proposal
    approval: Approval | None
    command: Command | None
    effect: EffectView | None
    state_label: str
    shown: Proposal
    shown_is_current: bool
    is_reviewer: bool
    is_admin: bool
    is_requester: bool
    is_editor: bool  # wrote the current version, so may not approve it
    has_voted: bool
    undecided: bool
    can_decide: bool
    can_revoke: bool
    editable: bool
    still_needed: int
    eligible: list[str]
    rejected_by: str
    rejection_reason: SafeString
    expires_in: str
    history: list[AuditEvent]
    history_rows: list[HistoryRow]
    history_total: int
    history_caption: str
    history_links: list[HistoryLink]
    evidence: list[EvidencePart]
    evidence_text: str
    now: datetime
    stamp: str
    poll_url: str
    poll_seconds: int
    # Who consumed the approval: an execution id from the runtime, revealed.
    consumed_by_html: SafeString = NO_HTML

    def context(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def expiry(fresh: Freshness, now: datetime) -> tuple[str | None, str]:
    """The approval's state at ``now`` and, while it is issued, the time left in words."""
    if fresh.approval_state is None or fresh.approval_expires_at is None:
        return fresh.approval_state, ""
    state = effective_approval_state(fresh.approval_state, fresh.approval_expires_at, now)
    if state != Approval.State.ISSUED:
        return state, ""
    return state, timesince(now, fresh.approval_expires_at, depth=1)


def panel_stamp(fresh: Freshness, viewer: Viewer, *, shown_digest: str, now: datetime) -> str:
    """The decision panel's stamp, from what ``selectors.freshness_get`` reads in one
    query: a poll compares it before it reads anything else."""
    return stamp(
        [
            fresh.status,
            fresh.updated_at,
            fresh.last_event_id,
            *expiry(fresh, now),
            fresh.command_state,
            fresh.reviewers,
            fresh.quorum,
            shown_digest,
            viewer,
        ]
    )


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


def decision_panel(
    snapshot: ReviewSnapshot, viewer: Viewer, *, shown_digest: str = ""
) -> DecisionPanel:
    occurrence, decision, window = snapshot.occurrence, snapshot.decision, snapshot.history
    history = window.events
    now = snapshot.now
    proposal = decision.proposal
    # The digest the page on screen displays: the approve form sends it, never a newer one.
    shown = next(
        (p for p in occurrence.proposals.all() if p.action_digest == shown_digest), proposal
    )
    undecided = decision.state in {PanelState.PENDING, PanelState.AWAITING_QUORUM}
    approval = decision.approval
    eligible = [
        name
        for name in snapshot.reviewer_names
        if name not in decision.voters
        and not same_person(occurrence.requested_by, name)
        and (proposal.edited_by is None or name != proposal.edited_by.username)
    ]
    expires_in = ""
    if approval is not None and decision.state in {PanelState.ISSUED, PanelState.DELIVERED}:
        expires_in = timesince(now, approval.expires_at, depth=1)
    editable = (
        viewer.is_reviewer
        and occurrence.status in {Occurrence.Status.PENDING_REVIEW, Occurrence.Status.APPROVED}
        and decision.state != PanelState.CONSUMED
    )
    can_decide = viewer.is_reviewer and undecided
    can_revoke = viewer.is_admin and decision.state in {PanelState.ISSUED, PanelState.DELIVERED}
    evidence = evidence_parts(snapshot.claims) if snapshot.claims is not None else []

    rendered = panel_stamp(
        snapshot.freshness, viewer, shown_digest=shown.action_digest, now=snapshot.now
    )
    poll_url = ""
    if not decision.final:
        # The poll re-renders the history window the page shows, not the newest.
        query = urlencode(
            {"shown": shown.action_digest, "rendered": rendered, **window.cursor.query}
        )
        poll_url = f"{reverse('approvals:panel', args=[occurrence.pk])}?{query}"

    return DecisionPanel(
        occurrence=occurrence,
        decision=decision,
        proposal=proposal,
        approval=approval,
        command=decision.command,
        effect=effect_view(decision.command, snapshot.effect) if decision.command else None,
        state_label=PANEL_LABELS[decision.state],
        shown=shown,
        shown_is_current=shown.pk == proposal.pk,
        is_reviewer=viewer.is_reviewer,
        is_admin=viewer.is_admin,
        # As the service judges it: requested_by names the viewer after normalization.
        is_requester=same_person(occurrence.requested_by, viewer.username, viewer.email),
        is_editor=proposal.edited_by is not None and proposal.edited_by.username == viewer.username,
        has_voted=viewer.username in decision.voters,
        undecided=undecided,
        can_decide=can_decide,
        can_revoke=can_revoke,
        editable=editable,
        still_needed=max(decision.needed - len(decision.votes), 0),
        eligible=eligible,
        rejected_by=snapshot.rejected_by,
        rejection_reason=reveal_html(occurrence.rejection_reason),
        expires_in=expires_in,
        history=history,
        history_rows=history_rows(history),
        history_total=window.total,
        history_caption=history_caption(window),
        history_links=history_links(occurrence.pk, window),
        evidence=evidence,
        evidence_text=evidence_text(evidence),
        now=now,
        stamp=rendered,
        poll_url=poll_url,
        poll_seconds=PANEL_POLL_SECONDS,
        consumed_by_html=reveal_html(approval.consumed_by_execution if approval else ""),
    )


@dataclass(frozen=True)
class DiffRow:
    key: SafeString
    old: SafeString
    new: SafeString
    change: str  # added, removed, changed


def diff_rows(old: Proposal, new: Proposal) -> list[DiffRow]:
    """The arguments that differ between two versions, by name."""
    before, after = old.arguments, new.arguments
    rows = []
    for key in sorted(set(before) | set(after)):
        old_text = json_value(before[key]) if key in before else ""
        new_text = json_value(after[key]) if key in after else ""
        if key in before and key in after and old_text == new_text:
            continue
        change = "added" if key not in before else "removed" if key not in after else "changed"
        rows.append(DiffRow(reveal_html(key), reveal_html(old_text), reveal_html(new_text), change))
    return rows


def diff_base(proposals: list[Proposal], current: Proposal, since_digest: str) -> Proposal | None:
    """The version a diff starts from: the one the reviewer saw before, else the previous."""
    base = next(
        (p for p in proposals if p.action_digest == since_digest and p.pk != current.pk), None
    )
    if base is None and current.version > 1:
        base = next((p for p in proposals if p.version == current.version - 1), None)
    return base


def edit_initial(proposal: Proposal) -> dict[str, str]:
    """The edit form's starting text: the current arguments, hidden characters escaped."""
    arguments = json.dumps(proposal.arguments, indent=2, ensure_ascii=False)
    return {"arguments": plain_reveal(arguments), "action_digest": proposal.action_digest}


@dataclass(frozen=True)
class Requester:
    """``requested_by`` as the agent gave it, and whether it names a member of the tenant."""

    html: SafeString  # as given, hidden characters shown
    verified: bool  # names a member (username or email, after ``identity_key``)
    member: str  # that member's username, when it is written differently

    @property
    def given(self) -> bool:
        return bool(self.html)


def requester(requested_by: str, members: Iterable[tuple[str, str]]) -> Requester:
    """``members`` are the tenant's (username, email) pairs."""
    match = next(
        (username for username, email in members if same_person(requested_by, username, email)),
        None,
    )
    return Requester(
        html=reveal_html(requested_by),
        verified=match is not None,
        member=match if match is not None and match != requested_by else "",
    )


def review_page(panel: DecisionPanel, *, since_digest: str = "") -> dict[str, Any]:
    """What the review page shows around the decision panel.

    Unlike the rest of this module it reads one thing: the tenant's members, to say whether
    ``requested_by`` names one of them (one query, only when a requester is given).
    """
    occurrence = panel.occurrence
    proposal = panel.proposal
    proposals = list(occurrence.proposals.all())
    arguments = proposal.arguments
    flags = argument_flags(arguments)
    look_alike = {c for flag in flags for c in flag.word if not c.isascii() and not is_hidden(c)}
    action = reveal(pretty(proposal.canonical_action), look_alike)
    base = diff_base(proposals, proposal, since_digest)
    tool = occurrence.tool
    members: list[tuple[str, str]] = []
    if occurrence.requested_by:
        members = tenant_members(occurrence.tenant_id)
    return {
        "tool": tool,
        "tenant": occurrence.tenant,
        "versions": len(proposals),
        "action_html": action.html,
        "hidden_chars": action.hidden,
        "look_alikes": flags,
        "money": money_lines(arguments),
        "reason_html": reveal_html(occurrence.reason),
        "requested_by_html": reveal_html(occurrence.requested_by),
        "requester": requester(occurrence.requested_by, members),
        "run_id_html": reveal_html(occurrence.run_id),
        "diff_base": base,
        "diff_rows": diff_rows(base, proposal) if base else [],
        "since_mode": base is not None and base.action_digest == since_digest,
        "next_version": proposal.version + 1,
        "replay_help": REPLAY_SAFETY_HELP.get(ToolContract.ReplaySafety(tool.replay_safety), ""),
        "quorum_rule": quorum_rule(tool, arguments),
        "lifetime": duration(tool.approval_lifetime.total_seconds()),
    }


def input_errors(details: list[dict[str, Any]], field: str | None, message: str) -> list[str]:
    """An InputError's messages with ``arguments.`` taken off the field names."""
    if not details:
        return [_field_message(field, message)]
    return [_field_message(d.get("field"), d.get("message", "")) for d in details]


def _field_message(field: str | None, message: str) -> str:
    if field and field.startswith("arguments."):
        return f"{field.removeprefix('arguments.')}: {message}"
    return message
