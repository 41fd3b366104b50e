"""What the agent API's OpenAPI document says beyond what ninja derives from each
operation's signature and response dict: the headers of the answers that carry them
(``Retry-After``, ``WWW-Authenticate``), the links between operations (propose → get →
token → claim → command), and the wording of the rules every JSON body follows.

``AgentAPI.get_openapi_schema`` applies :func:`complete` to ninja's document. The statuses
themselves are declared on each operation (``response={...}`` in ``approvals.api`` and
``reconciliation.api``); ``tests/api/test_schema.py`` checks that none is missing.
"""

from __future__ import annotations

import re
from http.client import responses as http_responses
from typing import Any

from pydantic.json_schema import JsonDict

# A JSON string without U+0000: PostgreSQL text cannot hold it, so every body and query
# refuses it (``nul_character``). Stated as a pattern wherever it is true.
NO_NUL = r"^[^\x00]*$"

# The integer range JSON carries exactly (RFC 8785 numbers are IEEE 754 doubles).
MAX_SAFE_INTEGER = 2**53 - 1

# A response field or parameter holding a UUID (``str(uuid)``).
UUID: JsonDict = {"format": "uuid"}

# Any JSON value the strict parser accepts, recursively: what `arguments` may hold before
# its tool's contract narrows it. A component, so that it can refer to itself.
JSON_VALUE_REF = {"$ref": "#/components/schemas/JSONValue"}
JSON_VALUE = {
    "description": "Any JSON value without a NUL character (U+0000) in a string or key and "
    "with integers within ±(2^53 - 1); at most 32 levels deep.",
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": "integer", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER},
        {"type": "number", "not": {"type": "integer"}},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": JSON_VALUE_REF},
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": JSON_VALUE_REF,
        },
    ],
}
# A field's ``json_schema_extra``: an object of such values (``complete`` writes the
# reference, which pydantic cannot resolve while it builds the model's own schema).
ARGUMENTS: JsonDict = {"x-strict-json": True}
_STRICT_OBJECT = {"propertyNames": {"pattern": NO_NUL}, "additionalProperties": JSON_VALUE_REF}

# The audit export's `since`: an ISO 8601 date, or date and time with an optional offset.
# The server reads what pydantic reads once the value starts as a date (ISO_DATE_PREFIX);
# the pattern is the part of that any client can rely on (years 1000 to 2999, days to 28
# in the schema, every real day on the server).
ISO_DATE_PREFIX = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}")
SINCE = {
    "type": "string",
    "pattern": r"^[12][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
    r"(T([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?)?$",
}


def decision_in_schema(schema: dict[str, Any]) -> None:
    """``DecisionIn``'s rules beyond its fields: `approve` needs `seen_digest` (without it,
    422 missing_field), `reject` a `reason` that is not blank (422 reason_required), and
    `reason` is text without NUL like any body's."""
    schema["anyOf"] = [
        {
            "properties": {
                "decision": {"const": "approve"},
                "seen_digest": {"type": "string", "pattern": NO_NUL},
            },
            "required": ["seen_digest"],
        },
        {
            "properties": {
                "decision": {"const": "reject"},
                "reason": {"type": "string", "pattern": r"^[^\x00]*[^\s\x00][^\x00]*$"},
            },
            "required": ["reason"],
        },
    ]
    reason = schema.get("properties", {}).get("reason", {})
    for branch in reason.get("anyOf", []):
        if branch.get("type") == "string":
            branch["pattern"] = NO_NUL


# A callback URL's shape (``approvals.callbacks``): http(s), a host, no NUL. Whether it is
# accepted also depends on the console's settings and the host (private addresses).
CALLBACK_URL = r"^https?://[^\x00\s/?#@]+([/?#][^\x00]*)?$"

# Examples that succeed with the shipped contracts (tests/api/test_schema.py runs them).
REFUND_ARGUMENTS = {
    "payment_id": "pay_123",
    "amount_minor": 8000,
    "currency": "EUR",
    "reason": "Damaged parcel",
}
EXECUTION_ID = "thread-7:call_0:1"

API_DESCRIPTION = (
    "The approval console's runtime API. Every error is "
    '`{"error": {"code", "message", "details"}}` (claim refusals keep `decision` and '
    "`reason` beside it). Authenticate with `Authorization: Bearer <runtime key>`; each key "
    "has a request budget per window (429 with `Retry-After`). Ids are UUIDs; an id that "
    "names nothing of the key's tenant is 404. A runtime proposes (`POST /occurrences`), "
    "waits for the review (`GET /occurrences/{occurrence_id}`), picks up the token "
    "(`POST /occurrences/{occurrence_id}/token`) and claims it (`POST /claims`): the "
    "responses' `links` say which value goes where. "
)

BODY_RULES = (
    "Every JSON body is parsed strictly before anything is written: integers within "
    "±(2^53 - 1) (`integer_out_of_range`), no NUL character (U+0000) in any string or key "
    "(`nul_character`), no duplicate keys, no `NaN`/`Infinity`, no lone surrogates, at most "
    "32 levels deep, UTF-8 (`invalid_encoding`), at most 64 KiB (413). An empty body is 400 "
    "`empty_body`, malformed JSON 400 `invalid_json`, another content type 415."
)
API_DESCRIPTION += BODY_RULES

CONTRACT_RULES = (
    "`arguments` is checked against the tool's contract: its JSON Schema is "
    "`arguments_schema` in `GET /api/v1/tools/{name}` (unknown keys are refused; money is "
    "integer minor units plus an ISO 4217 code; an integer is never written as a float). "
    "An unknown tool or arguments outside the contract are 422 (`unknown_tool`, "
    "`missing_argument`, `unknown_argument`, `invalid_argument`, ...), whatever this "
    "schema's generic `arguments` object allows."
)

_RETRY_AFTER_SCHEMA = {"type": "string", "pattern": "^[0-9]+$"}

# Response headers, per status: (header, required, description).
_HEADERS: dict[str, list[tuple[str, bool, str]]] = {
    "401": [("WWW-Authenticate", False, 'The scheme to use: `Bearer realm="agent-api"`.')],
    "429": [
        ("Retry-After", True, "Seconds until this runtime key (or access token) may ask again.")
    ],
    "503": [("Retry-After", True, "Seconds before the database is worth asking again.")],
    "409": [("Retry-After", False, "Only with `not_approved`: seconds before asking again.")],
}

_STATUS_TEXT = {
    "400": "The body is empty (`empty_body`), not JSON (`invalid_json`) or not UTF-8 "
    "(`invalid_encoding`).",
    "401": "No valid, active credential in `Authorization: Bearer …` (`unauthenticated`).",
    "413": "The body is larger than the operation accepts (`payload_too_large`).",
    "415": "Another content type than the operation's (`unsupported_media_type`).",
    "422": "Refused: `error.details` lists each `{field, code, message}`.",
    "429": "This runtime key (or reviewer's access token) asked too often "
    "(`rate_limited`); see `Retry-After`.",
    "503": "The database is unavailable (`database_unavailable`): nothing was changed; see "
    "`Retry-After`.",
}


def _occurrence(expression: str) -> dict[str, Any]:
    return {"occurrence_id": expression}


# operationId -> status -> link name -> link. The ids are ninja's (module_function).
_LINKS: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    "approvals_api_propose": {
        status: {
            "GetOccurrence": {
                "operationId": "approvals_api_occurrence_detail",
                "parameters": _occurrence("$response.body#/occurrence_id"),
                "description": "Read the occurrence: its status and the proposal's digest.",
            },
            "PickUpToken": {
                "operationId": "approvals_api_token_pickup",
                "parameters": _occurrence("$response.body#/occurrence_id"),
                "description": "Once approved: pick up the token (with an `execution_id`).",
            },
            "Renew": {
                "operationId": "approvals_api_occurrence_renew",
                "parameters": _occurrence("$response.body#/occurrence_id"),
                "description": "If its approval expired unclaimed: send it back to review.",
            },
        }
        for status in ("200", "201")
    },
    "approvals_api_occurrence_detail": {
        "200": {
            "PickUpToken": {
                "operationId": "approvals_api_token_pickup",
                "parameters": _occurrence("$response.body#/occurrence_id"),
                "description": "Once `status` is `approved`: pick up the token.",
            },
        }
    },
    "approvals_api_token_pickup": {
        "200": {
            "Claim": {
                "operationId": "approvals_api_claim",
                "requestBody": {"token": "$response.body#/token"},
                "description": "Claim with this token, the approved action and the "
                "execution it is bound to.",
            },
        }
    },
    "approvals_api_claim": {
        "200": {
            "GetCommand": {
                "operationId": "reconciliation_api_command_detail",
                "parameters": {"command_id": "$response.body#/command_id"},
                "description": "The command and its effect.",
            },
            "ReportEffect": {
                "operationId": "reconciliation_api_command_effect",
                "parameters": {"command_id": "$response.body#/command_id"},
                "description": "`executed_by: runtime`: report what the tool did.",
            },
        }
    },
    "reconciliation_api_occurrence_epoch": {
        "201": {
            "GetCommand": {
                "operationId": "reconciliation_api_command_detail",
                "parameters": {"command_id": "$response.body#/command_id"},
                "description": "The command the new epoch belongs to.",
            },
        }
    },
}


def _response(responses: dict[Any, Any], status: str) -> dict[str, Any] | None:
    for key in (status, int(status)):
        if key in responses:
            found: dict[str, Any] = responses[key]
            return found
    return None


def complete(schema: dict[str, Any]) -> dict[str, Any]:
    """ninja's document with the error statuses explained and the headers and links
    added, in place."""
    operation_ids = {
        operation.get("operationId")
        for item in schema.get("paths", {}).values()
        for operation in item.values()
        if isinstance(operation, dict)
    }
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict) and "responses" in operation:
                _complete_operation(operation, operation_ids)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for component in components.values():
        for prop in component.get("properties", {}).values():
            if prop.pop("x-strict-json", False):
                prop.update(_STRICT_OBJECT)
    components["JSONValue"] = JSON_VALUE
    return schema


# Path parameters that hold a UUID. The views take them as text and answer 404 for
# anything that names nothing, a malformed id included (never 422), so the format is
# declared here rather than by the parameter's type.
_UUID_PARAMETERS = {"occurrence_id", "command_id"}


def _complete_operation(operation: dict[str, Any], operation_ids: set[Any]) -> None:
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "path" and parameter.get("name") in _UUID_PARAMETERS:
            parameter["schema"] = {**parameter.get("schema", {}), **UUID}
    responses = operation["responses"]
    for status, text in _STATUS_TEXT.items():
        response = _response(responses, status)
        # ninja's description is the reason phrase; say which error it is.
        if response is not None and response.get("description") == http_responses[int(status)]:
            response["description"] = text
    for status, headers in _HEADERS.items():
        response = _response(responses, status)
        if response is None:
            continue
        for name, required, description in headers:
            schema = _RETRY_AFTER_SCHEMA if name == "Retry-After" else {"type": "string"}
            response.setdefault("headers", {})[name] = {
                "description": description,
                "required": required,
                "schema": schema,
            }
    for status, links in _LINKS.get(operation.get("operationId", ""), {}).items():
        response = _response(responses, status)
        if response is not None:
            response["links"] = {
                name: link for name, link in links.items() if link["operationId"] in operation_ids
            }
