"""Strict JSON in: no duplicate keys, no NaN or Infinity, no lone surrogates, no integer
JSON cannot carry exactly, no nesting deeper than ``MAX_DEPTH``; every refusal names its
field."""

from __future__ import annotations

import json
import math
from typing import Any

from approvals.errors import InputError

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


def printable_key(key: str) -> str:
    """A key as it can be quoted back in an error: lone surrogates become escapes."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def child_path(path: str, key: str) -> str:
    return f"{path}.{printable_key(key)}" if path else printable_key(key)


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
                f"The key {printable_key(value.duplicate)!r} appears twice in one object.",
                child_path(path, value.duplicate),
            )
        if isinstance(value, dict):
            for key, item in value.items():
                child = child_path(path, key)
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
