"""Tool contracts' JSON Schemas: checked when a contract is saved, and the arguments of every
proposal and claim validated against them (unknown keys refused, integers strict, patterns
as ECMA-262 reads them)."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.validators import extend

from approvals.canonical.money import currency_exponent, money_currencies
from approvals.canonical.parsing import printable_key
from approvals.errors import InputError


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
                f"{printable_key(str(code))[:40]!r} is not an ISO 4217 currency that money can be "
                "paid in: the codes for no currency (XXX), testing (XTS), precious metals, "
                "special drawing rights, bond units and funds are refused too."
            ),
        }
        for path, code in money_currencies(arguments)
        if currency_exponent(code) is None
    ]
    if money:
        raise InputError(money[0]["code"], money[0]["message"], money[0]["field"], money)
