"""Canonical bytes out: an action serialized with RFC 8785 (JSON Canonicalization Scheme)
and digested with SHA-256. The canonical bytes are what the reviewer sees and what the
approval is bound to."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import rfc8785

from approvals.errors import InputError


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
