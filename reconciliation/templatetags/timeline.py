"""``{% load timeline %}``: one entry of an occurrence's timeline, as one ``<tbody>``,
rendered in Python.

A timeline window shows fifty events and the adapter invocations among them; rendered
with template tags, their per-variable lookups, date filters and ``|reveal`` cost the page
more than its queries (as the review page's history did, see
``approvals/templatetags/rows.py``, whose escaping this shares). Agent-supplied text (the
actor, the details' values) goes through the same ``reveal`` as ``{{ value|reveal }}``.
"""

from __future__ import annotations

from django import template
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from approvals.templatetags.console_text import reveal
from approvals.templatetags.rows import cell_html
from reconciliation.web.presenters import TimelineRow

register = template.Library()


def _details(row: TimelineRow) -> str:
    if not row.details:
        return ""
    items = "".join(
        f'<div class="kv"><dt>{cell_html(key)}</dt>'
        f'<dd class="agent-text">{reveal(value)}</dd></div>'
        for key, value in row.details
    )
    return (
        '<tr class="history-details"><td></td>'
        f'<td colspan="4"><dl class="details">{items}</dl></td></tr>'
    )


@register.simple_tag
def timeline_entry(row: TimelineRow) -> SafeString:
    moment = timezone.localtime(row.at)
    flag = f" timeline-entry--{cell_html(row.flag)}" if row.flag else ""
    return mark_safe(  # noqa: S308 - every value above went through cell_html or reveal
        f'<tbody class="timeline-entry{flag}"><tr>'
        f'<td class="nowrap">{f"{moment:%H:%M:%S.%f}"[:12]} '
        f'<span class="muted">{moment:%Y-%m-%d}</span></td>'
        f'<td><code class="event-kind">{cell_html(row.kind)}</code></td>'
        f'<td class="agent-text">{reveal(row.actor) if row.actor else "—"}</td>'
        f'<td><code class="codes">{cell_html(row.summary or "—")}</code></td>'
        f'<td><code class="small mono">{cell_html(row.id)}</code></td>'
        f"</tr>{_details(row)}</tbody>"
    )
