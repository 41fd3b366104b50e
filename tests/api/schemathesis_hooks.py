"""Schemathesis hooks for the agent API (loaded with SCHEMATHESIS_HOOKS by
tests/api/test_schemathesis.py): the NDJSON body of ``POST /api/v1/audit/events``, and
long-polls kept short.

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
