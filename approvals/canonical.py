"""Strict JSON in, canonical bytes out.

Raw bodies are parsed strictly (no duplicate keys, no NaN or Infinity, no lone surrogates),
arguments are validated against the tool's JSON Schema, and the action is serialized with
RFC 8785 (JSON Canonicalization Scheme) and digested with SHA-256. The canonical bytes are
what the reviewer sees and what the approval is bound to.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import rfc8785
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
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


_type_checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer)
StrictValidator = extend(Draft202012Validator, type_checker=_type_checker)


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


def validate_arguments(schema: dict[str, Any], arguments: Any) -> None:
    """Raise InputError naming every field that breaks the contract."""
    if not isinstance(arguments, dict):
        raise InputError("wrong_type", "arguments must be a JSON object.", "arguments")
    validator = StrictValidator(schema)
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if errors:
        details = [_error_detail(e) for e in errors]
        first = details[0]
        raise InputError(first["code"], first["message"], first["field"], details)


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
