"""``{% load rows %}``: table rows that a page shows by the dozen, rendered in Python.

``{% history_event row %}`` renders one event of a review page's history
(``approvals.web.presenters.history.HistoryRow``) as one ``<tbody>``; ``{% inbox_row row show_tenant
%}`` one request of the inbox (``approvals.web.presenters.inbox.InboxRow``) as one ``<tr>``. A page
shows dozens of them, and the template engine's per-variable lookups, filters and ``{% url %}`` made
the rows cost more than the rest of their page. Every value goes through ``cell_html``, which
escapes it as the template would have (and leaves text that the presenters already revealed, a
SafeString, as it is).
"""

from __future__ import annotations

import html
from typing import Any

from django import template
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from approvals.web.links import occurrence_path
from approvals.web.presenters.history import HistoryRow
from approvals.web.presenters.inbox import InboxRow

register = template.Library()

MUTED_DASH = '<span class="muted">—</span>'
SECURITY = '<span aria-hidden="true">⚠ </span>Security: '


def cell_html(value: Any) -> str:
    """``conditional_escape`` without its lazy-string wrapper: this runs for every cell."""
    if hasattr(value, "__html__"):
        return str(value.__html__())
    return html.escape(str(value))


def _outcome(row: HistoryRow) -> str:
    event = row.event
    parts = []
    if row.flag:
        security = SECURITY if row.flag == "security" else ""
        label = cell_html(row.flag_label)
        parts.append(f'<span class="flag flag--{cell_html(row.flag)}">{security}{label}</span>')
    if row.outcome:
        parts.append(f'<span class="outcome-text">{cell_html(row.outcome)}</span>')
    if event.decision or event.reason_code:
        secondary = " codes--secondary" if row.flag else ""
        separator = " · " if event.decision and event.reason_code else ""
        parts.append(
            f'<code class="codes{secondary}">{cell_html(event.decision)}{separator}'
            f"{cell_html(event.reason_code)}</code>"
        )
    elif not row.flag:
        parts.append(MUTED_DASH)
    return " ".join(parts)


def _details(row: HistoryRow) -> str:
    if not row.details:
        return ""
    items = "".join(
        f'<div class="kv"><dt>{cell_html(d.key)}</dt><dd class="agent-text">'
        + (f"<code>{cell_html(d.value)}</code>" if d.code else cell_html(d.value))
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
    flag = f" history-event--{cell_html(row.flag)}" if row.flag else ""
    fingerprint = (
        f'<code class="fingerprint">{cell_html(event.token_fingerprint)}</code>'
        if event.token_fingerprint
        else MUTED_DASH
    )
    return mark_safe(  # noqa: S308 - every value above went through cell_html
        f'<tbody class="history-event{flag}"><tr>'
        f'<td class="history-time"><time datetime="{moment.isoformat()}">'
        f'<span class="nowrap">{moment:%H:%M:%S}</span> '
        f'<span class="muted nowrap">{moment:%Y-%m-%d}</span></time></td>'
        f'<td><code class="event-kind">{cell_html(row.kind)}</code></td>'
        f'<td class="history-actor agent-text">{cell_html(row.actor) if row.actor else "—"}</td>'
        f'<td class="outcome">{_outcome(row)}</td>'
        f"<td>{fingerprint}</td>"
        f"</tr>{_details(row)}</tbody>"
    )


def _look_alikes(row: InboxRow) -> str:
    if not row.flags:
        return ""
    # One <code> per path, a path flagged twice in a row named once.
    paths: list[str] = []
    for flag in row.flags:
        path = cell_html(flag.path)
        if not paths or paths[-1] != path:
            paths.append(path)
    codes = ", ".join(f"<code>{path}</code>" for path in paths)
    return (
        f'<span class="badge badge--pending badge--look-alike" title="{cell_html(row.flags_text)}">'
        f"⚠ look-alike text in {codes}</span> "
    )


def _money(row: InboxRow) -> str:
    if not row.money:
        return ""
    chips = "".join(
        f'<span class="money-chip"><span class="muted">{cell_html(line.label)}</span> '
        f"<strong>{cell_html(line.text)}</strong></span>"
        for line in row.money
    )
    return f'<span class="summary-money">{chips}</span>'


@register.simple_tag
def inbox_row(row: InboxRow, show_tenant: bool) -> SafeString:
    occurrence = row.occurrence
    pk = cell_html(occurrence.pk)
    tool = cell_html(occurrence.tool.name)
    created = timezone.localtime(occurrence.created_at)
    tenant = (
        f'<td class="cell-tenant">{cell_html(occurrence.tenant.name)}</td>' if show_tenant else ""
    )
    href = cell_html(occurrence_path("approvals:review", occurrence.pk))
    return mark_safe(  # noqa: S308 - every value above went through cell_html
        f'<tr data-occurrence-id="{pk}">'
        f'<td class="cell-tool"><code class="tool">{tool}</code></td>'
        f'<td class="summary">{_look_alikes(row)}{_money(row)}'
        f'<span class="summary-args agent-text">{cell_html(row.summary)}</span></td>'
        f'<td class="requester">'
        f'<span class="agent-text">{cell_html(row.requested_by) or "—"}</span>'
        f'<span class="run agent-text mono small">{cell_html(row.run_id)}</span></td>'
        f"{tenant}"
        f'<td class="cell-state"><span class="badge badge--{cell_html(row.badge)}">'
        f"{cell_html(row.label)}</span></td>"
        f'<td class="cell-age nowrap"><time datetime="{created.isoformat()}" '
        f'title="{created:%Y-%m-%d %H:%M:%S} UTC">{cell_html(row.age)}</time></td>'
        f'<td class="open-cell"><a id="review-link-{pk}" class="button button--small" '
        f'data-focus-group="review-links" href="{href}">Review<span class="visually-hidden"> '
        f"{tool} from {created:%Y-%m-%d %H:%M}</span></a></td>"
        "</tr>"
    )
