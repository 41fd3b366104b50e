"""Showing agent-supplied text: escaped, with hidden characters revealed as ``\\uXXXX`` and
look-alike letters flagged. Nothing here marks agent text safe unescaped."""

from __future__ import annotations

import html
import json
import unicodedata
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from approvals.canonical.confusables import (
    LookAlike,
    is_hidden,
    json_escape,
    look_alikes,
    plain_reveal,
)

__all__ = ["json_escape", "plain_reveal"]  # kept here for the pages that show text


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


def json_value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


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


def reveal_value(value: Any) -> SafeString:
    """Any value as ``reveal_html`` shows agent text; one already revealed (a SafeString)
    as it is, so that it is never escaped twice; None as nothing. What templates' ``reveal``
    filter does (``approvals.templatetags.console_text``, ``approvals.web.jinja``)."""
    if isinstance(value, SafeString):
        return value
    if value is None:
        return SafeString("")
    return reveal_html(str(value))
