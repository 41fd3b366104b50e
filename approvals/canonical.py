"""Strict JSON in, canonical bytes out.

Raw bodies are parsed strictly (no duplicate keys, no NaN or Infinity, no lone surrogates),
arguments are validated against the tool's JSON Schema, and the action is serialized with
RFC 8785 (JSON Canonicalization Scheme) and digested with SHA-256. The canonical bytes are
what the reviewer sees and what the approval is bound to.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import icu
import iso4217
import rfc8785
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.validators import extend


class InputError(Exception):
    """Bad input from outside, with a stable machine-readable code and the field it names."""

    def __init__(
        self,
        code: str,
        message: str,
        field: str | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.details = details or []


# --- strict parsing -----------------------------------------------------------------

# Deeper bodies are refused outright, so that no recursive step after parsing (schema
# validation, canonicalization, the pretty view) can run out of stack on hostile input.
MAX_DEPTH = 32
# RFC 8785 carries numbers as IEEE 754 doubles: integers beyond this lose digits.
MAX_SAFE_INTEGER = 2**53 - 1


class _Refused:
    """A value the decoder met but must not accept. It stays in the parsed tree until the
    walk after parsing finds it, because only the walk knows which field it sits in."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message


class _DuplicatedKeys(dict[str, Any]):
    duplicate: str


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            marked = _DuplicatedKeys(pairs)
            marked.duplicate = key
            return marked
        result[key] = value
    return result


def _constant(name: str) -> _Refused:
    return _Refused("non_finite_number", f"{name} is not a JSON number.")


def _float(text: str) -> float | _Refused:
    value = float(text)
    if not math.isfinite(value):
        return _Refused("non_finite_number", f"The number {text[:40]} is out of range.")
    return value


def _int(text: str) -> int | _Refused:
    # Checked on the text first: converting thousands of digits is slow, and Python
    # refuses more than 4300 with a ValueError.
    value = int(text) if len(text.lstrip("-")) <= 16 else None
    if value is None or abs(value) > MAX_SAFE_INTEGER:
        return _Refused(
            "integer_out_of_range",
            f"The integer {text[:40]} is beyond ±(2^53 - 1), the range JSON carries exactly.",
        )
    return value


def _printable(key: str) -> str:
    """A key as it can be quoted back in an error: lone surrogates become escapes."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def _child(path: str, key: str) -> str:
    return f"{path}.{_printable(key)}" if path else _printable(key)


def _check(value: Any, path: str, depth: int) -> None:
    if isinstance(value, _Refused):
        raise InputError(value.code, value.message, path or None)
    if isinstance(value, str):
        _check_string(value, path)
    elif isinstance(value, dict | list):
        if depth >= MAX_DEPTH:
            raise InputError(
                "nested_too_deeply", f"The body nests more than {MAX_DEPTH} levels.", path or None
            )
        if isinstance(value, _DuplicatedKeys):
            raise InputError(
                "duplicate_key",
                f"The key {_printable(value.duplicate)!r} appears twice in one object.",
                _child(path, value.duplicate),
            )
        if isinstance(value, dict):
            for key, item in value.items():
                child = _child(path, key)
                _check_string(key, child)
                _check(item, child, depth + 1)
        else:
            for index, item in enumerate(value):
                _check(item, f"{path}[{index}]", depth + 1)


def _check_string(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            "lone_surrogate", "A string holds a lone UTF-16 surrogate.", path or None
        ) from None
    if "\x00" in text:
        # Valid JSON, but PostgreSQL text and jsonb cannot hold it.
        raise InputError("nul_character", "A string holds a NUL character (U+0000).", path or None)


def parse_json(raw: bytes) -> Any:
    """Parse a request body, refusing anything two parsers could read differently or the
    database could not store: duplicate keys, NaN and Infinity, integers beyond ±(2^53 - 1),
    lone surrogates, NUL characters, nesting deeper than ``MAX_DEPTH``.

    Every refusal is an ``InputError`` whose ``field`` names where it sits
    (``arguments.amount_minor``, ``items[2]``).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("invalid_encoding", "The body is not valid UTF-8.") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_constant=_constant,
            parse_float=_float,
            parse_int=_int,
        )
    except json.JSONDecodeError as exc:
        raise InputError(
            "invalid_json", f"The body is not valid JSON: {exc.msg} at line {exc.lineno}."
        ) from None
    except RecursionError:
        raise InputError(
            "nested_too_deeply", f"The body nests more than {MAX_DEPTH} levels."
        ) from None
    _check(value, "", 0)
    return value


# --- contract validation --------------------------------------------------------------


def _is_strict_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 5.0 as an integer; money and counts here must be written as
    # integers, so a float is refused rather than rounded.
    return isinstance(instance, int) and not isinstance(instance, bool)


@lru_cache(maxsize=512)
def ecma_pattern(pattern: str) -> re.Pattern[str]:
    """A JSON Schema ``pattern`` compiled with ECMA-262's meaning of ``$``: the end of the
    string. Python's ``$`` also matches before a final newline, so ``^[a-z]+$`` would let
    ``"abc\\n"`` through an identifier pattern; here ``$`` outside a character class
    becomes ``\\Z``."""
    out: list[str] = []
    index, in_class = 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index : index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            # "[]" and "[^]" start with a literal "]" in Python's syntax.
            for prefix in ("]", "^]"):
                if pattern.startswith(prefix, index + 1):
                    out.append("[" + prefix)
                    index += 1 + len(prefix)
                    break
            else:
                out.append(char)
                index += 1
            continue
        elif char == "$":
            char = r"\Z"
        out.append(char)
        index += 1
    return re.compile("".join(out))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not ecma_pattern(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_type_checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer)
StrictValidator = extend(
    Draft202012Validator, validators={"pattern": _pattern}, type_checker=_type_checker
)


def check_contract_schema(schema: Any) -> list[str]:
    """Problems with a tool contract's JSON Schema, as messages for the admin form."""
    if not isinstance(schema, dict):
        return ["The schema must be a JSON object."]
    try:
        StrictValidator.check_schema(schema)
    except SchemaError as exc:
        return [f"Invalid JSON Schema: {exc.message}"]
    problems = []
    if schema.get("type") != "object":
        problems.append('The arguments schema must have "type": "object".')
    if schema.get("additionalProperties") is not False:
        problems.append('The arguments schema must set "additionalProperties": false.')
    return problems


_CODES = {
    "required": "missing_argument",
    "additionalProperties": "unknown_argument",
    "type": "wrong_type",
}


def _error_detail(error: Any) -> dict[str, Any]:
    path = ".".join(str(p) for p in error.absolute_path)
    code = _CODES.get(error.validator, "invalid_argument")
    fieldname = path
    if error.validator == "required":
        missing = [name for name in error.validator_value if name not in error.instance]
        fieldname = ".".join(filter(None, [path, missing[0] if missing else ""]))
    elif error.validator == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in known)
        fieldname = ".".join(filter(None, [path, extra[0] if extra else ""]))
    elif (
        error.validator == "type"
        and error.validator_value == "integer"
        and isinstance(error.instance, float)
    ):
        code = "float_not_allowed"
    return {
        "field": f"arguments.{fieldname}" if fieldname else "arguments",
        "code": code,
        "message": error.message,
    }


# --- contract schemas compiled once ---------------------------------------------------------
#
# jsonschema walks a schema keyword by keyword on every call (about 90 µs for the refund
# contract). A contract's schema is compiled once per version (its text) into plain Python
# checks that answer one question: does the instance pass? "Yes" is final; "no", or a schema
# using any keyword outside the few compiled here, goes to jsonschema, which decides and
# names every error as before. So the compiled checks can only make a valid call faster;
# they never decide a refusal or its message.

Check = Callable[[Any], bool]

# Keywords that only annotate: they change nothing about validity.
_ANNOTATIONS = frozenset({"title", "description", "examples", "default", "$comment"})
_TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


class _NotCompiled(Exception):
    """The schema uses something the compiled checks do not cover: jsonschema decides."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _type_check(value: Any) -> Check:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or any(n not in _TYPES for n in names):
        raise _NotCompiled
    tests = [_TYPES[n] for n in names]
    return lambda v: any(t(v) for t in tests)


def _properties_check(value: Any) -> Check:
    if not isinstance(value, dict):
        raise _NotCompiled
    compiled = {name: _compile(sub) for name, sub in value.items()}
    return lambda v: (
        not isinstance(v, dict) or all(check(v[k]) for k, check in compiled.items() if k in v)
    )


def _required_check(value: Any) -> Check:
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise _NotCompiled
    keys = tuple(value)
    return lambda v: not isinstance(v, dict) or all(k in v for k in keys)


def _no_additional_check(schema: dict[str, Any]) -> Check:
    if schema["additionalProperties"] is not False or "patternProperties" in schema:
        raise _NotCompiled
    known = frozenset(schema.get("properties", {}))
    return lambda v: not isinstance(v, dict) or v.keys() <= known


def _length_check(keyword: str, value: Any) -> Check:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _NotCompiled
    if keyword == "minLength":
        return lambda v: not isinstance(v, str) or len(v) >= value
    return lambda v: not isinstance(v, str) or len(v) <= value


def _pattern_check(value: Any) -> Check:
    if not isinstance(value, str):
        raise _NotCompiled
    search = ecma_pattern(value).search
    return lambda v: not isinstance(v, str) or search(v) is not None


_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {
    "minimum": lambda v, n: bool(v >= n),
    "maximum": lambda v, n: bool(v <= n),
    "exclusiveMinimum": lambda v, n: bool(v > n),
    "exclusiveMaximum": lambda v, n: bool(v < n),
}


def _bound_check(keyword: str, value: Any) -> Check:
    if not _number(value):
        raise _NotCompiled
    test = _BOUNDS[keyword]
    return lambda v: not _number(v) or test(v, value)


def _compile(schema: Any) -> Check:
    """One schema (object) as a check of its keywords, or _NotCompiled."""
    if not isinstance(schema, dict):
        raise _NotCompiled
    checks: list[Check] = []
    for keyword, value in schema.items():
        if keyword in _ANNOTATIONS:
            continue
        if keyword == "type":
            checks.append(_type_check(value))
        elif keyword == "properties":
            checks.append(_properties_check(value))
        elif keyword == "required":
            checks.append(_required_check(value))
        elif keyword == "additionalProperties":
            checks.append(_no_additional_check(schema))
        elif keyword in ("minLength", "maxLength"):
            checks.append(_length_check(keyword, value))
        elif keyword == "pattern":
            checks.append(_pattern_check(value))
        elif keyword in _BOUNDS:
            checks.append(_bound_check(keyword, value))
        else:
            raise _NotCompiled
    return lambda v: all(check(v) for check in checks)


# schema text -> (jsonschema validator, compiled check or None); emptied when full.
_CONTRACT_VALIDATORS: dict[str, tuple[Any, Check | None]] = {}
_CONTRACT_VALIDATORS_MAX = 256


def contract_validator(schema: dict[str, Any]) -> tuple[Any, Check | None]:
    """The contract schema's jsonschema validator and its compiled check (None when the
    schema uses a keyword the check does not cover), made once per schema text: an edited
    contract is a new text, so it gets validators of its own."""
    text = repr(schema)  # JSON values only: their repr is as exact as their JSON, and faster
    found = _CONTRACT_VALIDATORS.get(text)
    if found is None:
        own = copy.deepcopy(schema)  # the caller's dict may change; the validators' may not
        try:
            passes: Check | None = _compile(own)
        except _NotCompiled:
            passes = None
        found = (StrictValidator(own), passes)
        if len(_CONTRACT_VALIDATORS) >= _CONTRACT_VALIDATORS_MAX:
            _CONTRACT_VALIDATORS.clear()
        _CONTRACT_VALIDATORS[text] = found
    return found


def validate_arguments(schema: dict[str, Any], arguments: Any) -> None:
    """Raise InputError naming every field that breaks the contract."""
    if not isinstance(arguments, dict):
        raise InputError("wrong_type", "arguments must be a JSON object.", "arguments")
    validator, passes = contract_validator(schema)
    if passes is not None and passes(arguments):
        errors = []
    else:
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if errors:
        details = [_error_detail(e) for e in errors]
        first = details[0]
        raise InputError(first["code"], first["message"], first["field"], details)
    money = [
        {
            "field": f"arguments.{path}",
            "code": "unknown_currency",
            "message": (
                f"{_printable(str(code))[:40]!r} is not an ISO 4217 currency that money can be "
                "paid in: the codes for no currency (XXX), testing (XTS), precious metals, "
                "special drawing rights, bond units and funds are refused too."
            ),
        }
        for path, code in money_currencies(arguments)
        if currency_exponent(code) is None
    ]
    if money:
        raise InputError(money[0]["code"], money[0]["message"], money[0]["field"], money)


# --- money ------------------------------------------------------------------------------

MINOR_SUFFIX = "_minor"


def _accepted_currencies() -> dict[str, int]:
    """ISO 4217 (the maintenance agency's list one, as the ``iso4217`` package ships it):
    every current currency with its minor-unit exponent. Codes without minor units (XXX no
    currency, XTS testing, XAU and the other precious metals, XDR, XSU, XUA, the XB* bond
    units) and the funds codes (BOV, CHE, CHW, CLF, COU, MXV, USN, UYI) are not money a
    payment is made in, so they are left out."""
    funds = {
        (entry.findtext("Ccy") or "").strip()
        for entry in iso4217.raw_xml.iter("CcyNtry")
        if (name := entry.find("CcyNm")) is not None and name.get("IsFund") == "true"
    }
    return {
        currency.value: currency.exponent
        for currency in iso4217.Currency
        if currency.exponent is not None and currency.value not in funds
    }


CURRENCIES: dict[str, int] = _accepted_currencies()


def currency_exponent(code: Any) -> int | None:
    """Digits after the decimal point in the ISO 4217 currency ``code`` (2 for EUR, 0 for
    JPY, 3 for KWD), or None when ``code`` is no currency money is paid in."""
    return CURRENCIES.get(code) if isinstance(code, str) else None


def is_amount(key: str, value: Any) -> bool:
    """An integer amount in minor units: a ``*_minor`` key holding an integer."""
    return (
        key.endswith(MINOR_SUFFIX)
        and len(key) > len(MINOR_SUFFIX)
        and isinstance(value, int)
        and not isinstance(value, bool)
    )


def money_currencies(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """The ``currency`` of every object holding an integer ``*_minor`` amount, with its
    path (``currency``, ``lines[0].currency``): money is minor units plus a currency."""
    if isinstance(value, dict):
        if "currency" in value and any(is_amount(k, v) for k, v in value.items()):
            yield _child(path, "currency"), value["currency"]
        for key, nested in value.items():
            if isinstance(nested, dict | list):
                yield from money_currencies(nested, _child(path, key))
    elif isinstance(value, list):
        for index, nested in enumerate(value):
            yield from money_currencies(nested, f"{path}[{index}]")


# --- canonical form -------------------------------------------------------------------


@dataclass(frozen=True)
class CanonicalAction:
    canonical: str
    digest: str


def canonicalize(tool: str, arguments: Any) -> CanonicalAction:
    """RFC 8785 bytes of ``{"tool", "arguments"}`` and their SHA-256 hex digest."""
    try:
        data = rfc8785.dumps({"tool": tool, "arguments": arguments})
    except rfc8785.IntegerDomainError:
        raise InputError(
            "integer_out_of_range", "An integer is beyond the range JSON can carry exactly."
        ) from None
    except (rfc8785.FloatDomainError, rfc8785.CanonicalizationError) as exc:
        raise InputError(
            "not_canonicalizable", f"The action cannot be canonicalized: {exc}"
        ) from None
    except RecursionError:
        raise InputError("nested_too_deeply", "The action nests too deeply.") from None
    return CanonicalAction(canonical=data.decode("utf-8"), digest=hashlib.sha256(data).hexdigest())


def pretty(canonical: str) -> str:
    """The canonical JSON indented for reading.

    Only whitespace is added: keys keep the canonical order and every string and number is
    written with exactly the characters of the canonical form (``1e-7`` stays ``1e-7``, where
    ``json.dumps`` would print ``1e-07``), so what a reviewer reads is what was digested.
    """
    # Numbers are kept as the canonical text spelled them: parsed back, a float such as
    # 1e16 (canonically "10000000000000000") would come back as an int too large to re-encode.
    return _pretty(json.loads(canonical, parse_int=_Number, parse_float=_Number), "")


class _Number(str):
    """A number token exactly as the canonical text spells it."""


def _pretty(value: Any, indent: str) -> str:
    inner = indent + "  "
    if isinstance(value, dict) and value:
        items = [f"{inner}{_leaf(k)}: {_pretty(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and value:
        items = [inner + _pretty(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return _leaf(value)


def _leaf(value: Any) -> str:
    if isinstance(value, _Number):
        return str(value)
    return rfc8785.dumps(value).decode("utf-8")


# --- text a person must read correctly -----------------------------------------------------

# Characters that render as nothing, as a space, or that reorder the text around them
# (bidi controls): a reviewer cannot see them.
_HIDDEN_CATEGORIES = {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"}


def is_hidden(char: str) -> bool:
    if char in "\n\t":
        return False
    category = unicodedata.category(char)
    return category in _HIDDEN_CATEGORIES or (category == "Zs" and char != " ")


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
    the TR39 skeleton (so ``Rita``, ``rita ``, ``rita\\u200b``, ``RITA`` and ``r\\u0456ta``
    with a Cyrillic ``\\u0456`` all give ``rita``)."""
    # NFKC first: it turns no-break and other wide spaces into plain ones.
    visible = "".join(c for c in unicodedata.normalize("NFKC", name) if not is_hidden(c))
    folded = " ".join(visible.casefold().split())
    return unicodedata.normalize("NFKC", skeleton(folded)).casefold()


def same_person(name: str, *identities: str) -> bool:
    """Whether ``name`` (agent-supplied) names one of ``identities`` (a username, an email
    address) after ``identity_key``. An empty or invisible name names no one."""
    key = identity_key(name)
    return bool(key) and any(key == identity_key(i) for i in identities if i)


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
