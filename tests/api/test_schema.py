"""The OpenAPI schema cannot drift from the server: for every operation, the statuses a
sample of bad requests gets are listed with the error envelope; ids are UUIDs; request
strings state the NUL rule; the examples succeed; the links chain propose → get → token →
claim; the audit stream is NDJSON and its lines match the documented line schema."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import jsonschema
import pytest
from django.test import Client

from approvals.api import openapi
from tests.conftest import Runtime, approve

SCHEMA_URL = "/api/v1/openapi.json"
METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture
def schema(db: Any) -> dict[str, Any]:
    response = Client().get(SCHEMA_URL)
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def concrete(path: str) -> str:
    """The path with every parameter filled: ids with a UUID that names nothing."""
    return re.sub(r"\{[^}]+\}", str(uuid.uuid4()), path)


def documented(operation: dict[str, Any], status: int) -> dict[str, Any]:
    responses = operation["responses"]
    assert str(status) in responses, (
        f"{operation['operationId']} answers {status}, which its schema does not list "
        f"(it lists {sorted(responses)})"
    )
    response: dict[str, Any] = responses[str(status)]
    return response


def assert_enveloped(schema: dict[str, Any], operation: dict[str, Any], response: Any) -> None:
    """The status is listed, with a body schema the actual body matches."""
    listed = documented(operation, response.status_code)
    content = listed.get("content", {})
    assert "application/json" in content, (operation["operationId"], response.status_code)
    body_schema = {**content["application/json"]["schema"], "components": schema["components"]}
    jsonschema.validate(response.json(), body_schema)
    assert set(response.json()["error"]) == {"code", "message", "details"}


def send(client: Client, method: str, path: str, body: bytes, content_type: str) -> Any:
    return client.generic(method.upper(), path, body, content_type=content_type)


# --- statuses -------------------------------------------------------------------------------


def test_every_operation_lists_401_and_answers_it_without_a_key(schema: dict[str, Any]) -> None:
    ops = operations(schema)
    assert len(ops) >= 15
    for path, method, operation in ops:
        assert operation.get("security"), f"{operation['operationId']} needs no credential?"
        response = send(Client(), method, concrete(path), b"", "application/json")
        assert response.status_code == 401, (path, method, response.status_code)
        assert_enveloped(schema, operation, response)


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"", "application/json", 400, "empty_body"),
        (b'{"tool": ', "application/json", 400, "invalid_json"),
        (b'{"tool": "\xff"}', "application/json", 400, "invalid_encoding"),
        (b"{}", "text/plain", 415, "unsupported_media_type"),
        (b'{"no such field": 1}', "application/json", 422, None),
        (b'{"n": 9007199254740992}', "application/json", 422, "integer_out_of_range"),
        (b'{"s": "a\\u0000b"}', "application/json", 422, "nul_character"),
        (b'{"x": "' + b"y" * (70 * 1024) + b'"}', "application/json", 413, "payload_too_large"),
    ],
)
def test_every_json_body_operation_lists_what_a_bad_body_gets(
    schema: dict[str, Any],
    runtime: Runtime,
    body: bytes,
    content_type: str,
    status: int,
    code: str | None,
) -> None:
    with_body = [
        (path, method, operation)
        for path, method, operation in operations(schema)
        if "application/json" in operation.get("requestBody", {}).get("content", {})
    ]
    assert len(with_body) >= 7
    for path, method, operation in with_body:
        # A reviewer token's operation refuses a runtime key before reading the body.
        if "RuntimeKeyAuth" not in {name for s in operation["security"] for name in s}:
            continue
        if not body and not operation["requestBody"].get("required"):
            continue  # an optional body may be empty (the token pickup's)
        response = send(runtime.client, method, concrete(path), body, content_type)
        assert response.status_code == status, (path, method, response.content[:300])
        if code is not None:
            assert response.json()["error"]["code"] == code
        assert_enveloped(schema, operation, response)


def test_every_operation_lists_429_with_retry_after(
    schema: dict[str, Any], runtime: Runtime, settings: Any
) -> None:
    settings.API_RATE_LIMIT = 1
    runtime.get("/api/v1/tools")
    for path, method, operation in operations(schema):
        if "RuntimeKeyAuth" not in {name for s in operation["security"] for name in s}:
            continue
        response = send(runtime.client, method, concrete(path), b"{}", "application/json")
        assert response.status_code == 429, (path, method)
        assert_enveloped(schema, operation, response)
        header = documented(operation, 429)["headers"]["Retry-After"]
        assert header["required"] is True
        assert re.fullmatch(header["schema"]["pattern"], response["Retry-After"])
        assert "503" in operation["responses"], operation["operationId"]


def test_unknown_ids_are_404_and_listed(schema: dict[str, Any], runtime: Runtime) -> None:
    with_ids = [
        (path, method, operation)
        for path, method, operation in operations(schema)
        if "{" in path and "RuntimeKeyAuth" in {n for s in operation["security"] for n in s}
    ]
    assert len(with_ids) >= 7
    for path, method, operation in with_ids:
        body = b"{}" if path.endswith("/token") or method == "get" else None
        if body is None:
            body = json.dumps(_valid_body(operation)).encode()
        response = send(runtime.client, method, concrete(path), body, "application/json")
        if method == "get" or path.endswith(("/token", "/renew")):
            assert response.status_code == 404, (path, response.content[:200])
        assert_enveloped(schema, operation, response)


def _valid_body(operation: dict[str, Any]) -> dict[str, Any]:
    """A body the operation's fields accept (ids aside), from its examples or plain text."""
    name = operation["operationId"]
    return {
        "reconciliation_api_command_effect": {"execution_id": "e-1", "outcome": "committed"},
        "reconciliation_api_occurrence_epoch": {"execution_id": "e-1", "reason": "retry"},
    }.get(name, {})


def test_a_malformed_audit_query_is_422_and_listed(
    schema: dict[str, Any], runtime: Runtime
) -> None:
    operation = schema["paths"]["/api/v1/audit/events"]["get"]
    for query in ("since=yesterday", "since=0.5", "occurrence=x", "execution=a%00b", "limit=0"):
        response = runtime.get(f"/api/v1/audit/events?{query}")
        assert response.status_code == 422, (query, response.content[:200])
        assert_enveloped(schema, operation, response)


def test_a_nul_in_a_lookup_or_tool_name_is_refused_not_a_server_error(runtime: Runtime) -> None:
    # Found by Schemathesis: PostgreSQL text cannot hold U+0000, and these reached a query.
    assert runtime.get("/api/v1/occurrences?run_id=a%00&client_ref=b").status_code == 422
    assert runtime.get("/api/v1/tools/issue%00refund").status_code == 404
    assert runtime.get("/api/v1/audit/events?fingerprint=a%00").status_code == 422


def test_a_since_offset_postgresql_refuses_is_read_in_utc(runtime: Runtime) -> None:
    # Found by Schemathesis: +18:27 is ISO 8601 but beyond PostgreSQL's ±15:59 (was a 500).
    response = runtime.get("/api/v1/audit/events?since=2417-08-28T23:43:51%2B18:27")
    assert response.status_code == 200
    assert runtime.get("/api/v1/audit/events?since=9999-12-31T23:00:00-05:00").status_code == 422


# --- what the document says ------------------------------------------------------------


def test_ids_carry_format_uuid(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    for name, field in [
        ("ProposeOut", "occurrence_id"),
        ("OccurrenceOut", "occurrence_id"),
        ("PriorDecisionOut", "occurrence_id"),
        ("CommandOut", "id"),
        ("ClaimOut", "command_id"),
        ("CommandDetailOut", "command_id"),
        ("CommandDetailOut", "occurrence_id"),
    ]:
        assert components[name]["properties"][field]["format"] == "uuid", (name, field)
    for path, _, operation in operations(schema):
        for parameter in operation["parameters"]:
            if parameter["name"] in {"occurrence_id", "command_id"}:
                assert parameter["schema"]["format"] == "uuid", (path, parameter["name"])


def _strings(node: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("type") == "string" and not {"enum", "const", "format"} & set(node):
            found.append((where, node))
        for key, value in node.items():
            found.extend(_strings(value, f"{where}.{key}"))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(_strings(value, f"{where}[{index}]"))
    return found


def test_request_strings_state_the_nul_rule_and_integers_their_range(
    schema: dict[str, Any],
) -> None:
    components = schema["components"]["schemas"]
    request_components = {
        ref.rsplit("/", 1)[1]
        for _, _, operation in operations(schema)
        for media in operation.get("requestBody", {}).get("content", {}).values()
        for ref in re.findall(r'"\$ref": "([^"]+)"', json.dumps(media))
    }
    assert {"ClaimIn", "TokenIn", "EffectIn"} <= request_components
    # A proposal and a canonicalization are `oneOf` a variant per tool contract.
    assert {"ProposeIn.issue_refund", "CanonicalizeIn.issue_refund"} <= request_components
    checked = 0
    for name in request_components | {"JSONValue", "ProposeIn", "CanonicalizeIn"}:
        for where, string in _strings(components[name], name):
            pattern = string.get("pattern")
            assert pattern is not None, f"{where} does not state the NUL rule"
            assert re.search(pattern, "a\x00b") is None, where
            checked += 1
    assert checked >= 15
    integer = next(b for b in components["JSONValue"]["anyOf"] if b.get("type") == "integer")
    assert integer["maximum"] == 2**53 - 1 == -integer["minimum"]
    assert "2^53" in schema["info"]["description"]
    propose = schema["paths"]["/api/v1/occurrences"]["post"]
    assert "GET /api/v1/tools/{name}" in propose["description"]
    assert components["ProposeIn"]["properties"]["arguments"]["propertyNames"]["pattern"]


def test_the_audit_stream_is_ndjson_and_its_lines_match_the_line_schema(
    schema: dict[str, Any], runtime: Runtime
) -> None:
    export = schema["paths"]["/api/v1/audit/events"]["get"]["responses"]["200"]
    line_schema = export["content"]["application/x-ndjson"]["schema"]
    ingest = schema["paths"]["/api/v1/audit/events"]["post"]["requestBody"]["content"]
    assert list(ingest) == ["application/x-ndjson"]
    runtime.propose()

    response = runtime.get("/api/v1/audit/events")

    assert response["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert lines
    for line in lines:
        jsonschema.validate(line, line_schema, format_checker=jsonschema.FormatChecker())


def test_the_links_chain_propose_get_token_claim(schema: dict[str, Any]) -> None:
    by_id = {operation["operationId"]: operation for _, _, operation in operations(schema)}

    def links(operation_id: str, status: str) -> dict[str, Any]:
        found: dict[str, Any] = by_id[operation_id]["responses"][status]["links"]
        for link in found.values():
            target = by_id[link["operationId"]]
            names = {p["name"] for p in target["parameters"]}
            assert set(link.get("parameters", {})) <= names, link
        return found

    propose = links("approvals_api_propose", "201")
    assert propose["GetOccurrence"]["operationId"] == "approvals_api_occurrence_detail"
    assert links("approvals_api_occurrence_detail", "200")["PickUpToken"]["operationId"] == (
        "approvals_api_token_pickup"
    )
    claim = links("approvals_api_token_pickup", "200")["Claim"]
    assert claim == {**claim, "operationId": "approvals_api_claim"}
    assert claim["requestBody"] == {"token": "$response.body#/token"}
    assert "GetCommand" in links("approvals_api_claim", "200")


def _example(schema: dict[str, Any], component: str) -> dict[str, Any]:
    properties = schema["components"]["schemas"][component]["properties"]
    return {name: field["examples"][0] for name, field in properties.items() if "examples" in field}


def test_the_request_examples_succeed(
    schema: dict[str, Any], runtime: Runtime, reviewer: Any
) -> None:
    propose = _example(schema, "ProposeIn")
    assert propose["arguments"] == openapi.REFUND_ARGUMENTS

    proposed = runtime.post("/api/v1/occurrences", propose)
    assert proposed.status_code == 201, proposed.content
    occurrence_id = proposed.json()["occurrence_id"]
    approve(occurrence_id, reviewer)
    picked = runtime.post(f"/api/v1/occurrences/{occurrence_id}/token", _example(schema, "TokenIn"))
    assert picked.status_code == 200, picked.content
    claim = {
        **_example(schema, "ClaimIn"),
        "token": picked.json()["token"],
        "action": _example(schema, "ActionIn"),
    }
    claimed = runtime.post("/api/v1/claims", claim)

    assert claimed.status_code == 200, claimed.content
    assert claimed.json()["decision"] == "approved"
    assert picked.json()["execution_id"] == claim["execution_id"] == openapi.EXECUTION_ID


def test_a_callback_rotate_secret_must_be_a_boolean(runtime: Runtime) -> None:
    # Found by Schemathesis: a non-boolean was read as one (pydantic's lax bool).
    body = {"url": "https://agents.example.com/console-callback", "rotate_secret": "yes"}
    response = runtime.client.put("/api/v1/callback", body, content_type="application/json")

    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["field"] == "rotate_secret"
