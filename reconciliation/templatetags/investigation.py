"""``{% load investigation %}``: one step of an investigation's chain (or one run of steps
left out of a long chain), as one ``<tr>``, rendered in Python.

A chain shows a hundred steps and more (a runtime replaying a spent token thousands
of times): rendered with template tags, the rows cost the page more than reading and
judging the events did (as the inbox's did, see ``approvals/templatetags/rows.py``, whose
escaping this shares).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import tzinfo

from django import template
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from approvals.templatetags.rows import cell_html
from approvals.web.text import plain_reveal
from reconciliation.investigations.page import ChainGap, ChainRow

register = template.Library()

DASH = '<span class="muted">—</span>'
TIMES = "\u00d7"  # the multiplication sign of "delivered x3"


def _or_dash(value: str) -> str:
    """The value escaped, or an em dash for an empty one (``|default:"—"``)."""
    return cell_html(value) if value else "—"


COLUMNS = 9  # without the tenant's


TITLE_CHARS = 24  # of the query, in the page's <title>


@register.filter
def title_text(query: str) -> str:
    """The query for the page's ``<title>``, which holds text only: cut after
    ``TITLE_CHARS`` characters, and its hidden characters shown as ``\\uXXXX`` as the page
    shows them (a U+202E would reorder the title, in the tab and the history)."""
    shown = query if len(query) <= TITLE_CHARS else query[: TITLE_CHARS - 1] + "…"
    return plain_reveal(shown)


@register.simple_tag
def chain_rows(
    rows: Sequence[ChainRow | ChainGap], show_tenant: bool, every_step_url: str = ""
) -> SafeString:
    """Every row of the chain, in one tag: a hundred tag calls cost more than their rows.
    A long chain's rows repeat most of their cells (the same kind of replay of the same
    token, refused the same way), but for their time, execution, queue message and
    producer event id: each different set of the others is escaped and built once."""
    tz = timezone.get_current_timezone()
    cells: dict[tuple[object, ...], tuple[str, str, str]] = {}
    return mark_safe(  # noqa: S308 - each row is built by chain_row, which escapes
        "".join(chain_row(row, show_tenant, every_step_url, tz, cells) for row in rows)
    )


def chain_row(
    row: ChainRow | ChainGap,
    show_tenant: bool,
    every_step_url: str = "",
    tz: tzinfo | None = None,
    cells: dict[tuple[object, ...], tuple[str, str, str]] | None = None,
) -> SafeString:
    if isinstance(row, ChainGap):
        return chain_gap(row, show_tenant, every_step_url)
    at = row.at.astimezone(tz or timezone.get_current_timezone())
    if row.event_id:
        event_id = cell_html(row.event_id)
        attribute = f' data-event-id="{event_id}"'
        producer = f'<code class="small id">{event_id}</code>'
    else:
        attribute = ""
        producer = '<span class="muted small">adapter row</span>'
    key = (
        row.flag,
        row.kind,
        row.outcome,
        row.fingerprint,
        row.command_id,
        row.origin,
        row.deliveries,
        row.tenant if show_tenant else None,
    )
    built = cells.get(key) if cells is not None else None
    if built is None:
        built = _cells(row, show_tenant)
        if cells is not None:
            cells[key] = built
    before, command, after = built
    flag = f" chain-row--{cell_html(row.flag)}" if row.flag else ""
    return mark_safe(  # noqa: S308 - every value above went through cell_html
        f'<tr class="chain-row{flag}"{attribute}>'
        f'<td class="nowrap">{f"{at:%H:%M:%S.%f}"[:12]} '
        f'<span class="muted small">{at:%Y-%m-%d}</span></td>'
        f"{before}"
        f'<td><code class="agent-text">{_or_dash(row.execution)}</code></td>'
        f'<td><code class="agent-text small">{_or_dash(row.message)}</code></td>'
        f"{command}<td>{producer}</td>{after}</tr>"
    )


def _cells(row: ChainRow, show_tenant: bool) -> tuple[str, str, str]:
    """A row's cells but its time, execution, queue message and producer event id: those
    before the execution's (kind, outcome, fingerprint), the command's, and those after the
    producer's (origin, tenant)."""
    fingerprint = (
        f'<code class="fingerprint">{cell_html(row.fingerprint)}</code>'
        if row.fingerprint
        else DASH
    )
    command = (
        f'<code class="mono small" title="{cell_html(row.command_id)}">'
        f"{cell_html(row.command_id[:8])}…</code>"
        if row.command_id
        else DASH
    )
    delivered = (
        f' <span class="flag flag--duplicate">delivered {TIMES}{row.deliveries}</span>'
        if row.deliveries > 1
        else ""
    )
    tenant = f"<td>{cell_html(row.tenant)}</td>" if show_tenant else ""
    return (
        f'<td><code class="event-kind">{cell_html(row.kind)}</code></td>'
        f'<td><code class="codes">{_or_dash(row.outcome)}</code></td>'
        f"<td>{fingerprint}</td>",
        f"<td>{command}</td>",
        f'<td class="nowrap">{cell_html(row.origin)}{delivered}</td>{tenant}',
    )


def chain_gap(gap: ChainGap, show_tenant: bool, every_step_url: str) -> SafeString:
    steps = "step" if gap.hidden == 1 else "steps"
    link = f' <a href="{cell_html(every_step_url)}">Show every step</a>' if every_step_url else ""
    return mark_safe(  # noqa: S308 - every value above went through cell_html
        f'<tr class="chain-gap"><td colspan="{COLUMNS + show_tenant}">'
        f"<strong>{gap.hidden} earlier {steps} not shown</strong> "
        f'<span class="muted">({cell_html(gap.kinds)})</span>.{link}</td></tr>'
    )
