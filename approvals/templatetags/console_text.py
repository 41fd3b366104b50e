"""``{% load console_text %}``: the reveal treatment for text that templates get raw.

``{{ value|reveal }}`` escapes ``value`` and shows its hidden characters (bidi controls,
zero-width characters) as highlighted ``\\uXXXX`` escapes, as ``approvals.web.text.reveal_html``
does for agent text. A value already revealed (a SafeString) is left as it is, so it is
never escaped twice.
"""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString

from approvals.web.text import plain_reveal, reveal_value

register = template.Library()


TITLE_CHARS = 24  # of a query shown in a page's <title>


@register.filter
def title_text(query: str) -> str:
    """A query for a page's ``<title>``, which holds text only: cut after ``TITLE_CHARS``
    characters, and its hidden characters shown as ``\\uXXXX`` as the page shows them (a
    U+202E would reorder the title, in the tab and the history). Cut before revealing, so
    that an escape is never cut in half."""
    shown = query if len(query) <= TITLE_CHARS else query[: TITLE_CHARS - 1] + "…"
    return plain_reveal(shown)


@register.filter(is_safe=True)
def reveal(value: Any) -> SafeString:
    return reveal_value(value)
