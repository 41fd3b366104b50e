"""``{% load queue %}``: one row of the operations queue, as one ``<tr>``, rendered in Python.

The queue lists up to fifty items; rendered with template tags, their per-variable lookups,
date filters and ``{% url %}`` cost the page more than its queries (as the inbox's rows did,
see ``approvals/templatetags/rows.py``, whose escaping this shares).
"""

from __future__ import annotations

from django import template
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from approvals.templatetags.rows import cell_html
from approvals.web.links import occurrence_path
from reconciliation.web.presenters import QueueRow

register = template.Library()

NO_AMOUNT = '<span class="muted">—</span>'


@register.simple_tag
def queue_row(row: QueueRow, show_tenant: bool) -> SafeString:
    item = row.item
    occurrence = item.occurrence
    tool = cell_html(occurrence.tool.name)
    since = timezone.localtime(item.since)
    money = "".join(
        f'<span class="money-chip"><strong>{cell_html(line.text)}</strong></span>'
        for line in row.money
    )
    tenant = f"<td>{cell_html(occurrence.tenant.name)}</td>" if show_tenant else ""
    href = cell_html(occurrence_path("reconciliation:timeline", occurrence.pk))
    label = cell_html(item.reason_label)
    # An id that outlives the poll's swap keeps the keyboard on this link (console.js).
    link_id = cell_html("queue-link-" + item.key.replace(":", "-"))
    return mark_safe(  # noqa: S308 - every value above went through cell_html
        f'<tr data-item="{cell_html(item.key)}">'
        f'<td class="nowrap"><time datetime="{since.isoformat()}" '
        f'title="{since:%Y-%m-%d %H:%M:%S} UTC">{cell_html(row.age)}</time></td>'
        f'<td><span class="badge badge--reason-{cell_html(item.reason)}">{label}</span></td>'
        f'<td><code class="tool">{tool}</code></td>'
        f"<td>{money or NO_AMOUNT}</td>"
        f"{tenant}"
        f'<td><a id="{link_id}" class="button button--small" href="{href}" '
        f'data-focus-group="queue-links">Open<span class="visually-hidden"> '
        f"{tool}, {cell_html(item.reason_label.lower())}</span></a></td>"
        "</tr>"
    )
