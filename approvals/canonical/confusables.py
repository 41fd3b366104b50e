"""Text a person must read correctly: characters that render as nothing, identities that
name the same person, and look-alike letters from other scripts (Unicode TR39, from ICU)."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import icu

# Characters that render as nothing, as a space, or that reorder the text around them
# (bidi controls): a reviewer cannot see them.
_HIDDEN_CATEGORIES = {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"}


@lru_cache(maxsize=4096)
def is_hidden(char: str) -> bool:
    """Whether a reader cannot see ``char``: a control, format, private-use, unassigned or
    line-breaking character, a space other than U+0020, or any Unicode
    Default_Ignorable_Code_Point (from ICU: the combining grapheme joiner U+034F, variation
    selectors, the Hangul fillers), which renderers draw as nothing.

    The Hangul fillers U+115F, U+1160, U+3164 and U+FFA0 are letters (Lo) drawn as blank
    space, the known spoof ("worker-a\\u3164" reads as "worker-a"): they are hidden because
    Unicode lists them as default ignorable, which a test holds ICU's data to."""
    if char in "\n\t":
        return False
    category = unicodedata.category(char)
    return (
        category in _HIDDEN_CATEGORIES
        or (category == "Zs" and char != " ")
        or bool(icu.Char.hasBinaryProperty(char, icu.UProperty.DEFAULT_IGNORABLE_CODE_POINT))
    )


def strip_hidden(text: str) -> str:
    """``text`` without the characters ``is_hidden`` names."""
    return "".join(c for c in text if not is_hidden(c))


@cache
def _spoof_checker() -> Any:
    """ICU's implementation of Unicode TR39 (security mechanisms): skeletons from
    confusables.txt, and the restriction levels that define mixed-script text."""
    checker = icu.SpoofChecker()
    checker.setChecks(icu.USpoofChecks.RESTRICTION_LEVEL | icu.USpoofChecks.MIXED_NUMBERS)
    # TR39's "highly restrictive": one script, or Latin with Han and the Japanese or
    # Korean scripts that go with it. Latin with Cyrillic or Greek in one word is not.
    checker.setRestrictionLevel(icu.URestrictionLevel.HIGHLY_RESTRICTIVE)
    return checker


def skeleton(text: str) -> str:
    """The TR39 skeleton of ``text``: two strings with one skeleton look alike."""
    return str(_spoof_checker().getSkeleton(0, text))


def identity_key(name: str) -> str:
    """What is left of a person's name or address once everything a reader cannot see is
    gone: NFKC, hidden characters removed, case folded, spaces trimmed and collapsed, then
    the TR39 skeleton (so ``Rita``, ``rita ``, ``rita\\u200b``, ``rita\\u034f``,
    ``rita\\u3164``, ``RITA`` and ``r\\u0456ta`` with a Cyrillic ``\\u0456`` all give
    ``rita``)."""
    # NFKC first: it turns no-break and other wide spaces into plain ones (and the
    # halfwidth Hangul filler into another filler, hidden as well).
    visible = strip_hidden(unicodedata.normalize("NFKC", name))
    folded = " ".join(visible.casefold().split())
    # Hidden characters removed once more at the end: nothing a reader cannot see may
    # survive into the key, whatever the skeleton or the last NFKC map a character to.
    return strip_hidden(unicodedata.normalize("NFKC", skeleton(folded)).casefold())


def same_person(name: str, *identities: str) -> bool:
    """Whether ``name`` (agent-supplied) names one of ``identities`` (a username, an email
    address) after ``identity_key``. An empty or invisible name names no one."""
    key = identity_key(name)
    return bool(key) and any(key == identity_key(i) for i in identities if i)


def member_named(name: str, members: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """The first of ``members`` (a tenant's (username, email) pairs) that ``name``
    (agent-supplied) names after ``identity_key``, or None."""
    return next((m for m in members if same_person(name, *m)), None)


def json_escape(char: str) -> str:
    """``char`` as JSON writes it escaped: ``\\uXXXX``, or a surrogate pair above U+FFFF."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def plain_reveal(text: str) -> str:
    """``text`` with hidden characters as ``\\uXXXX``: for a textarea, or plain text."""
    return "".join(json_escape(c) if is_hidden(c) and ord(c) > 0x7F else c for c in text)


@dataclass(frozen=True)
class LookAlike:
    """A word of agent-supplied text that is not what it looks like."""

    word: str
    reads_as: str  # what a reader takes it for: look-alike characters replaced
    reasons: tuple[str, ...]


_LETTERS_AND_DIGITS = ("L", "N")


_MARKS = {"Mn", "Me"}


_COMMON_SCRIPTS = {icu.UScriptCode.COMMON, icu.UScriptCode.INHERITED, icu.UScriptCode.UNKNOWN}


_MAX_LOOK_ALIKES = 20


def _char_name(char: str) -> str:
    return f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed character')}"


@lru_cache(maxsize=4096)
def _imitates(char: str) -> str:
    """The ASCII text a non-ASCII letter or digit passes for, or "": its TR39 skeleton
    (Cyrillic \\u0430 -> a, Cherokee \\u13ce -> 4, the ligature \\ufb01 -> fi), else its NFKC
    form (fullwidth \\uff14 -> 4, superscript \\u00b2 -> 2)."""
    if (
        char.isascii()
        or is_hidden(char)
        or not unicodedata.category(char).startswith(_LETTERS_AND_DIGITS)
    ):
        return ""
    for form in (skeleton(char), unicodedata.normalize("NFKC", char)):
        if form != char and form.isascii() and form.isprintable():
            return form
    return ""


def _scripts(word: str) -> list[str]:
    names: dict[str, None] = {}
    for char in word:
        script = icu.Script.getScript(char)
        if script.getScriptCode() not in _COMMON_SCRIPTS:
            names[str(script.getName()).replace("_", " ")] = None
    return list(names)


def _look_alike(word: str) -> LookAlike | None:
    reasons: list[str] = []
    problems = int(_spoof_checker().check(word))
    mixed = bool(problems & icu.USpoofChecks.RESTRICTION_LEVEL)
    if mixed:
        reasons.append(f"mixes scripts in one word: {' + '.join(_scripts(word))}")
    if problems & icu.USpoofChecks.MIXED_NUMBERS:
        reasons.append("mixes digits of different number systems")
    word = unicodedata.normalize("NFC", word)
    # A word in one script is flagged only when all of it passes for ASCII (Cyrillic
    # "\u0440\u0430\u0443" is "pay" to a reader, while an ordinary Russian word is plainly
    # Cyrillic), or for its compatibility characters (fullwidth, ligatures, superscripts),
    # which always pass for others.
    passes_for_ascii = mixed or skeleton(word).isascii()
    reads: list[str] = []
    base = ""
    for char in word:
        if unicodedata.category(char) in _MARKS and not is_hidden(char):
            # A mark that NFC could not fold into a letter with its ASCII base: a hat on
            # a digit, a dot under an underscore. Easy to miss, and no letter anywhere.
            if base.isascii() and base:
                reasons.append(f"{_char_name(char)} is stacked on {base!r}")
                continue
        else:
            base = char
        imitated = _imitates(char)
        if imitated and (passes_for_ascii or unicodedata.normalize("NFKC", char) != char):
            reasons.append(f"{_char_name(char)} looks like {imitated!r}")
            reads.append(imitated)
        else:
            reads.append(char)
    if not reasons:
        return None
    return LookAlike(word, "".join(reads), tuple(dict.fromkeys(reasons)))


def look_alikes(text: str) -> list[LookAlike]:
    """The words of ``text`` that are not what they look like (Unicode TR39): a word mixing
    scripts (``p\u0430y_42``, Latin and Cyrillic) or number systems, letters and digits
    that pass for ASCII ones (Cyrillic ``\u0430``, fullwidth ``\uff14``), and combining
    marks stacked on an ASCII character (``4\u0302``). Plain ASCII is never flagged, and
    neither is ordinary text in one script (``café``, ``Привет``)."""
    if text.isascii():
        return []
    found: list[LookAlike] = []
    for word in text.split():
        if word.isascii():
            continue
        flagged = _look_alike(word)
        if flagged is not None:
            found.append(flagged)
            if len(found) == _MAX_LOOK_ALIKES:
                break
    return found
