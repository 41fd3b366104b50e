"""Schemathesis hooks for the agent API (loaded with SCHEMATHESIS_HOOKS by
tests/api/test_schemathesis.py): the NDJSON body of ``POST /api/v1/audit/events``,
long-polls kept short, and a contract's integers written as integers.

The schema describes that body as an array of line objects (OpenAPI 3.1 has no item schema
for a sequence of JSON texts); on the wire each item is one line."""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx: Any, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)


@schemathesis.hook
def map_query(ctx: Any, query: Any) -> Any:
    """A long-poll's ``wait`` is valid up to 60 s and the live console here serves WSGI, where
    a waiting request holds its thread for that long: ask for at most one second, so the
    run stays short while still taking the waiting path."""
    if isinstance(query, dict) and isinstance(query.get("wait"), int) and query["wait"] > 1:
        query["wait"] = 1
    return query


# The operations whose body carries a tool's `arguments`, checked against its contract.
CONTRACT_ARGUMENTS = {"approvals_api_propose", "approvals_api_canonicalize_action"}


def _integers_spelled_as_integers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _integers_spelled_as_integers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integers_spelled_as_integers(item) for item in value]
    return value


@schemathesis.hook
def before_call(ctx: Any, case: Any, kwargs: Any) -> None:
    """A contract's integers are written as JSON integers: `8000.0` is refused as
    `float_not_allowed` (approvals.canonical.schema), on purpose, since a claim of `8000.0`
    must not match an approval of `8000`. JSON Schema 2020-12, which OpenAPI 3.1 uses,
    counts `8000.0` as an integer and cannot say so; the document says it in words, and here
    Schemathesis's whole-float spelling of an integer is sent as the integer it stands for.
    Only whole floats change: a real fraction, or an integer written as a string, is sent as
    drawn."""
    operation = case.operation
    if operation.schema.get_operation_id(operation) not in CONTRACT_ARGUMENTS:
        return
    if isinstance(case.body, dict) and "arguments" in case.body:
        case.body = {
            **case.body,
            "arguments": _integers_spelled_as_integers(case.body["arguments"]),
        }
