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

from approvals.web.text import reveal_html

register = template.Library()


@register.filter(is_safe=True)
def reveal(value: Any) -> SafeString:
    if isinstance(value, SafeString):
        return value
    if value is None:
        return SafeString("")
    return reveal_html(str(value))
