"""The Jinja2 environment of ``templates/jinja2/``: the long tables' rows (an inbox page, a
history window, the operators' queue, a timeline window, an investigation's chain).

Rendered in Django templates, fifty to a hundred rows cost a page two to three times the
rest of it (``bench/page_instructions.py``: the long history's review page, 38M
instructions with its rows built in Python, 97M with them in Django templates). Django's
own Jinja2 backend compiles a template to Python once and escapes every value (autoescape
on), so the rows stay templates escaped by a template engine, at about what Python strings
cost. A value already safe (Django's ``SafeString``, as ``reveal`` returns) is left as it
is. ``render_rows`` puts a rows template into a page.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.template import engines
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from jinja2 import Environment

from approvals.web.text import reveal_value


def _at(moment: datetime, fmt: str) -> str:
    """``moment`` in the current time zone, as ``strftime`` writes it (``iso``: the ISO 8601
    form Django's ``date:"c"`` writes)."""
    local = timezone.localtime(moment)
    return local.isoformat() if fmt == "iso" else local.strftime(fmt)


def environment(**options: Any) -> Environment:
    env = Environment(**options)  # noqa: S701 (autoescape is on: Django's backend sets it)
    env.filters.update({"at": _at, "reveal": reveal_value})
    return env


def render_rows(template: str, context: dict[str, Any]) -> SafeString:
    """The rows ``template`` (under ``templates/jinja2/``) renders: HTML the template engine
    escaped, ready for a Django template's ``{{ }}``."""
    html = engines["jinja2"].get_template(template).render(context)
    return mark_safe(html)  # noqa: S308 - rendered with autoescape on
