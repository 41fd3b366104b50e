"""The tool contracts in the OpenAPI document: a request that names a tool is described by
that tool's contract, so that a request valid by the document is one the server accepts.

``POST /api/v1/occurrences`` and ``POST /api/v1/actions/canonicalize`` take ``{tool,
arguments, ...}``, and the server refuses any ``arguments`` outside the tool's contract
(``approvals.canonical.schema.validate_arguments``). Their request bodies are therefore
``oneOf`` one variant per contract, discriminated by ``tool``: the generic component
(``ProposeIn``, ``CanonicalizeIn``) with ``tool`` the contract's name and ``arguments`` the
contract's JSON Schema, made strict as the server reads it (``strict_arguments``).

Contracts live in the database and change at run time, so the document follows them: it is
built per contract version (a digest of every contract's name and schema, read with one
query on each request for the document) and kept per process until the contracts change.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from approvals.api import openapi
from approvals.canonical.money import CURRENCIES, MINOR_SUFFIX

# The operations whose body names a tool, and the generic component of that body.
CONTRACT_BODIES = {
    "approvals_api_propose": "ProposeIn",
    "approvals_api_canonicalize_action": "CanonicalizeIn",
}

_NO_NUL = {"pattern": openapi.NO_NUL}
_SAFE_INTEGER = openapi.MAX_SAFE_INTEGER
_CURRENCY_CODES = sorted(CURRENCIES)
# Object schemas' keywords holding one subschema, a list of them, or a name -> subschema map.
_ONE = ("additionalProperties", "items", "contains", "not", "if", "then", "else")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "dependentSchemas")
_COMPOSED = ("allOf", "anyOf", "oneOf", "not", "$ref", "enum", "const", "if")


def _types(node: dict[str, Any]) -> set[str]:
    found = node.get("type")
    if isinstance(found, str):
        return {found}
    return set(found) if isinstance(found, list) else set()


def _with(node: dict[str, Any], extra: dict[str, Any]) -> None:
    """Add ``extra``'s keywords to ``node``; those it already has go into its ``allOf``."""
    clashing = {k: v for k, v in extra.items() if k in node}
    node.update({k: v for k, v in extra.items() if k not in node})
    if clashing:
        node.setdefault("allOf", []).append(clashing)


def _money_rule(node: dict[str, Any]) -> None:
    """``approvals.canonical.money``: an object holding an integer ``*_minor`` amount holds
    its ``currency`` as an ISO 4217 code money is paid in (not XXX, XTS, metals, funds)."""
    properties = node.get("properties", {})
    closed = node.get("additionalProperties") is False and "patternProperties" not in node
    if closed and "currency" not in properties:
        return
    minor = [k for k in properties if k.endswith(MINOR_SUFFIX) and len(k) > len(MINOR_SUFFIX)]
    if closed and not minor:
        return
    currency = {"enum": _CURRENCY_CODES}
    required = set(node.get("required", []))
    if closed and any(
        k in required and _types(properties[k]) == {"integer"} for k in minor
    ):  # an amount is always there: the currency is always money's
        _with(properties["currency"], currency)
        return
    has_amount: list[dict[str, Any]] = [
        {"required": [k], "properties": {k: {"type": "integer"}}} for k in minor
    ]
    if not closed:
        # Some key ending in _minor holds an integer: not all of them hold something else.
        has_amount.append(
            {"not": {"patternProperties": {".+_minor$": {"not": {"type": "integer"}}}}}
        )
    rule = {"if": {"anyOf": has_amount}, "then": {"properties": {"currency": currency}}}
    _with(node, rule)


def _strict(node: Any) -> Any:
    """One subschema with the strict parser's rules (``approvals.canonical.parsing``) added:
    no NUL in a string or key, integers within ±(2^53 - 1), any unconstrained value a
    JSON value of those (``JSONValue``); and the money rule."""
    if node is True:
        return dict(openapi.JSON_VALUE_REF)
    if not isinstance(node, dict):
        return node
    node = {k: v for k, v in node.items()}
    for keyword in _ONE:
        if isinstance(node.get(keyword), dict | bool) and node[keyword] is not False:
            node[keyword] = _strict(node[keyword])
    for keyword in _LIST:
        if isinstance(node.get(keyword), list):
            node[keyword] = [_strict(sub) for sub in node[keyword]]
    for keyword in _MAP:
        if isinstance(node.get(keyword), dict):
            node[keyword] = {name: _strict(sub) for name, sub in node[keyword].items()}
    types = _types(node)
    if not types and not any(k in node for k in (*_COMPOSED, *_MAP)):
        return {**node, "allOf": [*node.get("allOf", []), openapi.JSON_VALUE_REF]}
    if "string" in types:
        _with(node, dict(_NO_NUL))
    if types & {"integer"}:
        low, high = node.get("minimum"), node.get("maximum")
        node["minimum"] = -_SAFE_INTEGER if low is None else max(low, -_SAFE_INTEGER)
        node["maximum"] = _SAFE_INTEGER if high is None else min(high, _SAFE_INTEGER)
    if "object" in types or "properties" in node:
        if node.get("additionalProperties") is not False:
            _with(node, {"propertyNames": dict(_NO_NUL)})
            node.setdefault("additionalProperties", dict(openapi.JSON_VALUE_REF))
        _money_rule(node)
    if "array" in types and "items" not in node:
        node["items"] = dict(openapi.JSON_VALUE_REF)
    return node


def strict_arguments(contract_schema: dict[str, Any]) -> dict[str, Any]:
    """A contract's arguments schema as the server applies it: the contract (JSON Schema
    2020-12, which OpenAPI 3.1 uses) and the rules every body follows."""
    strict: dict[str, Any] = _strict(copy.deepcopy(contract_schema))
    return strict


_COMPONENT_NAME = re.compile(r"[^A-Za-z0-9._-]")


def _component(base: str, tool: str, taken: set[str]) -> str:
    name = f"{base}.{_COMPONENT_NAME.sub('_', tool)}"
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def add_contracts(document: dict[str, Any], contracts: list[tuple[str, dict[str, Any]]]) -> None:
    """Describe the bodies that name a tool by each tool's contract, in place: ``oneOf`` a
    variant per contract, discriminated by ``tool``. Without contracts the generic body stays
    (every request then answers 422 unknown_tool)."""
    if not contracts:
        return
    components = document["components"]["schemas"]
    taken = set(components)
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict):
                continue
            base = CONTRACT_BODIES.get(operation.get("operationId", ""))
            media = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if base is None or media is None or base not in components:
                continue
            mapping: dict[str, str] = {}
            for tool, contract_schema in contracts:
                variant = copy.deepcopy(components[base])
                variant["title"] = f"{base} for {tool}"
                properties = variant["properties"]
                properties["tool"] = {
                    "const": tool,
                    "description": "The tool this variant describes.",
                }
                arguments = strict_arguments(contract_schema)
                arguments["description"] = (
                    f"The arguments of `{tool}`, by its contract (`GET /api/v1/tools/{tool}`). "
                    "An integer is written as a JSON integer: `8000.0` or `8e3` is 422 "
                    "`float_not_allowed`, which JSON Schema, where 8000.0 is an integer, "
                    "cannot say."
                )
                properties["arguments"] = arguments
                name = _component(base, tool, taken)
                components[name] = variant
                mapping[tool] = f"#/components/schemas/{name}"
            media["schema"] = {
                "oneOf": [{"$ref": ref} for ref in mapping.values()],
                "discriminator": {"propertyName": "tool", "mapping": mapping},
            }


def contracts_version(contracts: list[tuple[str, dict[str, Any]]]) -> str:
    """A digest of what the document takes from the contracts."""
    text = json.dumps(contracts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class DocumentCache:
    """The document per (path prefix, contract version), built once per process: ninja and
    ``openapi.complete`` take about 100 ms, which a request for the document should not
    cost each time. A new contract version replaces the old one's document."""

    def __init__(self) -> None:
        self._documents: dict[str, tuple[str, dict[str, Any]]] = {}

    def get(self, prefix: str, version: str, build: Callable[[], dict[str, Any]]) -> Any:
        found = self._documents.get(prefix)
        if found is None or found[0] != version:
            found = (version, build())
            self._documents[prefix] = found
        # A copy: the caller (ninja's view, a test) may change what it is given.
        return copy.deepcopy(found[1])
