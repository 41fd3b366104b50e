"""``{% load history %}``: one event of a review page's history, as one ``<tbody>``.

``{% history_event row %}`` renders a ``presenters.HistoryRow`` in Python rather than with
template tags: a history window shows dozens of events, and the template engine's
per-variable lookups made each one cost more than the rest of the page. Every value goes
through ``_html``, which escapes it as the template would have (and leaves text that
``presenters.history_row`` already revealed, a SafeString, as it is).
"""

from __future__ import annotations

import html
from typing import Any

from django import template
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from approvals.presenters import HistoryRow

register = template.Library()

MUTED_DASH = '<span class="muted">—</span>'
SECURITY = '<span aria-hidden="true">⚠ </span>Security: '


def _html(value: Any) -> str:
    """``conditional_escape`` without its lazy-string wrapper: this runs for every cell."""
    if hasattr(value, "__html__"):
        return str(value.__html__())
    return html.escape(str(value))


def _outcome(row: HistoryRow) -> str:
    event = row.event
    parts = []
    if row.flag:
        security = SECURITY if row.flag == "security" else ""
        parts.append(
            f'<span class="flag flag--{_html(row.flag)}">{security}{_html(row.flag_label)}</span>'
        )
    if row.outcome:
        parts.append(f'<span class="outcome-text">{_html(row.outcome)}</span>')
    if event.decision or event.reason_code:
        secondary = " codes--secondary" if row.flag else ""
        separator = " · " if event.decision and event.reason_code else ""
        parts.append(
            f'<code class="codes{secondary}">{_html(event.decision)}{separator}'
            f"{_html(event.reason_code)}</code>"
        )
    elif not row.flag:
        parts.append(MUTED_DASH)
    return " ".join(parts)


def _details(row: HistoryRow) -> str:
    if not row.details:
        return ""
    items = "".join(
        f'<div class="kv"><dt>{_html(d.key)}</dt><dd class="agent-text">'
        + (f"<code>{_html(d.value)}</code>" if d.code else _html(d.value))
        + "</dd></div>"
        for d in row.details
    )
    return (
        '<tr class="history-details"><td><span class="visually-hidden">Details</span></td>'
        f'<td colspan="4"><dl class="details">{items}</dl></td></tr>'
    )


@register.simple_tag
def history_event(row: HistoryRow) -> SafeString:
    event = row.event
    moment = timezone.localtime(event.source_time)
    flag = f" history-event--{_html(row.flag)}" if row.flag else ""
    fingerprint = (
        f'<code class="fingerprint">{_html(event.token_fingerprint)}</code>'
        if event.token_fingerprint
        else MUTED_DASH
    )
    return mark_safe(  # noqa: S308 - every value above went through _html
        f'<tbody class="history-event{flag}"><tr>'
        f'<td class="history-time"><time datetime="{moment.isoformat()}">'
        f'<span class="nowrap">{moment:%H:%M:%S}</span> '
        f'<span class="muted nowrap">{moment:%Y-%m-%d}</span></time></td>'
        f'<td><code class="event-kind">{_html(row.kind)}</code></td>'
        f'<td class="history-actor agent-text">{_html(row.actor) if row.actor else "—"}</td>'
        f'<td class="outcome">{_outcome(row)}</td>'
        f"<td>{fingerprint}</td>"
        f"</tr>{_details(row)}</tbody>"
    )
