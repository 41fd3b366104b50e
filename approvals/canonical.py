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


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise InputError("duplicate_key", f"The key {key!r} appears twice in one object.", key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise InputError("non_finite_number", f"{name} is not a JSON number.")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError("non_finite_number", f"The number {text[:40]} is out of range.")
    return value


def _check_strings(value: Any, path: str = "") -> None:
    if isinstance(value, str):
        _check_string(value, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            _check_string(key, child)
            _check_strings(item, child)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_strings(item, f"{path}[{index}]")


def _check_string(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            "lone_surrogate", "A string holds a lone UTF-16 surrogate.", path or None
        ) from None


def parse_json(raw: bytes) -> Any:
    """Parse a request body, refusing anything two parsers could read differently."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("invalid_encoding", "The body is not valid UTF-8.") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
            parse_float=_parse_float,
        )
    except json.JSONDecodeError as exc:
        raise InputError(
            "invalid_json", f"The body is not valid JSON: {exc.msg} at line {exc.lineno}."
        ) from None
    except RecursionError:
        raise InputError("invalid_json", "The body is nested too deeply.") from None
    _check_strings(value)
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
    return CanonicalAction(canonical=data.decode("utf-8"), digest=hashlib.sha256(data).hexdigest())


def pretty(canonical: str) -> str:
    """The canonical JSON indented for reading; keys keep the canonical order."""
    return json.dumps(json.loads(canonical), indent=2, ensure_ascii=False)
