"""Issue 23: the OpenAPI document describes a proposal's `arguments` by its tool's contract.

``POST /api/v1/occurrences`` (and ``POST /api/v1/actions/canonicalize``) is ``oneOf`` a
variant per tool contract, discriminated by ``tool``, so that a body valid by the document
is one the server accepts, and one it refuses is invalid by the document. The contracts
live in the database: the document follows an edit at the next request for it, and is built
once per contract version, not per request (approvals.api.contract_openapi).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from django.test import Client
from ninja import NinjaAPI

from approvals.api import openapi
from approvals.api.contract_openapi import strict_arguments
from approvals.canonical.parsing import parse_json
from approvals.canonical.schema import validate_arguments
from approvals.errors import InputError
from approvals.models import ToolContract
from tests.conftest import REFUND_ARGS, Runtime

SCHEMA_URL = "/api/v1/openapi.json"


def document() -> dict[str, Any]:
    response = Client().get(SCHEMA_URL)
    assert response.status_code == 200
    found: dict[str, Any] = response.json()
    return found


def body_schema(doc: dict[str, Any], path: str = "/api/v1/occurrences") -> dict[str, Any]:
    schema: dict[str, Any] = doc["paths"][path]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]
    return schema


def valid_by_document(doc: dict[str, Any], instance: Any, schema: dict[str, Any]) -> bool:
    """Whether ``instance`` is valid by ``schema``, its references resolved in ``doc``."""
    rooted = {**schema, "components": doc["components"]}
    validator = jsonschema.Draft202012Validator(rooted)
    return validator.is_valid(instance)


@pytest.mark.django_db
def test_the_proposal_body_is_one_of_the_tool_contracts() -> None:
    doc = document()
    schema = body_schema(doc)
    names = sorted(ToolContract.objects.values_list("name", flat=True))

    assert schema["discriminator"]["propertyName"] == "tool"
    assert sorted(schema["discriminator"]["mapping"]) == names
    assert [ref["$ref"] for ref in schema["oneOf"]] == list(
        schema["discriminator"]["mapping"].values()
    )
    refund = doc["components"]["schemas"]["ProposeIn.issue_refund"]
    assert refund["properties"]["tool"]["const"] == "issue_refund"
    arguments = refund["properties"]["arguments"]
    contract = ToolContract.objects.get(name="issue_refund").json_schema
    assert arguments["required"] == contract["required"]
    assert arguments["additionalProperties"] is False
    assert set(arguments["properties"]) == set(contract["properties"])
    # Money: the currency is one that money is paid in, as the server requires.
    assert "EUR" in arguments["properties"]["currency"]["enum"]
    assert "XXX" not in arguments["properties"]["currency"]["enum"]
    # The rest of the body is the generic one's.
    assert refund["required"] == doc["components"]["schemas"]["ProposeIn"]["required"]
    canonicalize = body_schema(doc, "/api/v1/actions/canonicalize")
    assert sorted(canonicalize["discriminator"]["mapping"]) == names


def refund(**arguments: Any) -> dict[str, Any]:
    return {
        "tool": "issue_refund",
        "arguments": {**REFUND_ARGS, **arguments},
        "run_id": "run-1",
        "reason": "why",
    }


AGREEMENT_BODIES = [
    pytest.param(refund(), id="a-refund"),
    pytest.param(refund(currency="JPY", amount_minor=75_000), id="another-currency"),
    pytest.param(refund(currency="XXX"), id="no-currency-money"),
    pytest.param(refund(currency="XAU"), id="gold"),
    pytest.param(refund(amount_minor=0), id="below-the-contract"),
    pytest.param(refund(payment_id="pay 1"), id="outside-the-pattern"),
    pytest.param(refund(extra=1), id="an-unknown-argument"),
    pytest.param({**refund(), "tool": "no_such_tool"}, id="an-unknown-tool"),
    pytest.param({**refund(), "tool": "send_message"}, id="the-arguments-of-another-tool"),
    pytest.param(
        {
            "tool": "send_message",
            "arguments": {"to": "a@example.com", "subject": "s", "body": "b"},
            "run_id": "run-1",
            "reason": "r",
        },
        id="a-message",
    ),
    pytest.param(
        {
            "tool": "send_message",
            "arguments": {"to": "a@example.com", "subject": "s\u0000", "body": "b"},
            "run_id": "run-1",
            "reason": "r",
        },
        id="a-nul-character",
    ),
    pytest.param(
        {"tool": "lookup_order", "arguments": {"order_id": "o-1"}, "run_id": "r", "reason": ""},
        id="a-lookup",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize("body", AGREEMENT_BODIES)
def test_the_document_and_the_server_agree(runtime: Runtime, body: dict[str, Any]) -> None:
    doc = document()

    answer = runtime.post("/api/v1/occurrences", body)

    accepted = answer.status_code in (200, 201)
    assert valid_by_document(doc, body, body_schema(doc)) == accepted, answer.content


@pytest.mark.django_db
def test_a_new_or_edited_contract_is_in_the_next_document() -> None:
    before = document()
    assert "wire_funds" not in body_schema(before)["discriminator"]["mapping"]

    ToolContract.objects.create(
        name="wire_funds",
        json_schema={
            "type": "object",
            "additionalProperties": False,
            "required": ["iban"],
            "properties": {"iban": {"type": "string", "maxLength": 34}},
        },
    )
    added = document()
    ToolContract.objects.filter(name="wire_funds").update(
        json_schema={
            "type": "object",
            "additionalProperties": False,
            "required": ["iban", "amount_minor", "currency"],
            "properties": {
                "iban": {"type": "string", "maxLength": 34},
                "amount_minor": {"type": "integer", "minimum": 1},
                "currency": {"type": "string"},
            },
        }
    )
    edited = document()
    ToolContract.objects.filter(name="wire_funds").delete()
    removed = document()

    assert "wire_funds" in body_schema(added)["discriminator"]["mapping"]
    variant = added["components"]["schemas"]["ProposeIn.wire_funds"]["properties"]["arguments"]
    assert variant["required"] == ["iban"]
    variant = edited["components"]["schemas"]["ProposeIn.wire_funds"]["properties"]["arguments"]
    assert variant["required"] == ["iban", "amount_minor", "currency"]
    assert "XXX" not in variant["properties"]["currency"]["enum"]
    assert "wire_funds" not in body_schema(removed)["discriminator"]["mapping"]
    assert "ProposeIn.wire_funds" not in removed["components"]["schemas"]


@pytest.mark.django_db
def test_the_document_is_built_once_per_contract_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    real = NinjaAPI.get_openapi_schema

    def counted(self: Any, **kwargs: Any) -> Any:
        built.append(kwargs.get("path_prefix", ""))
        return real(self, **kwargs)

    monkeypatch.setattr(NinjaAPI, "get_openapi_schema", counted)
    ToolContract.objects.filter(name="lookup_order").update(description="Changed, not in it")
    first = document()  # a version this process may not have built yet
    built.clear()

    for _ in range(3):
        assert document() == first
    assert built == []

    contract = ToolContract.objects.get(name="lookup_order")
    contract.json_schema = {**contract.json_schema, "description": "A new version."}
    contract.save()
    document()
    assert len(built) == 1


@pytest.mark.django_db
def test_without_contracts_the_generic_body_stays() -> None:
    ToolContract.objects.all().delete()

    schema = body_schema(document())

    assert schema == {"$ref": "#/components/schemas/ProposeIn"}


# --- the rules the server adds to a contract ---------------------------------------------------

ROOT = {"components": {"schemas": {"JSONValue": openapi.JSON_VALUE}}}

CONTRACTS: list[dict[str, Any]] = [
    {  # money in nested lines, and an open metadata object
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "lines": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "price_minor": {"type": "integer"},
                        "currency": {"type": "string"},
                    },
                },
            },
            "metadata": {"type": "object"},
            "anything": {},
            "count": {"type": "integer"},
        },
    },
]

INSTANCES = [
    {"lines": [{"price_minor": 5, "currency": "EUR"}]},
    {"lines": [{"price_minor": 5, "currency": "XXX"}]},
    {"lines": [{"currency": "XXX"}]},  # no amount: not money
    {"metadata": {"fee_minor": 3, "currency": "XTS"}},
    {"metadata": {"fee_minor": "3", "currency": "XTS"}},  # a string is no amount
    {"metadata": {"note\u0000": 1}},
    {"metadata": {"note": "a\u0000b"}},
    {"metadata": {"deep": {"n": 2**53}}},
    {"anything": 2**53 - 1},
    {"anything": -(2**53)},
    {"anything": [1, "x", None, {"k": True}]},
    {"count": 2**53},
    {"count": 7},
]


def server_accepts(schema: dict[str, Any], instance: Any) -> bool:
    try:
        # As a request body arrives: parsed strictly, then checked against the contract.
        arguments = parse_json(json.dumps(instance).encode())
        validate_arguments(schema, arguments)
    except InputError:
        return False
    return True


@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.parametrize("instance", INSTANCES, ids=lambda i: json.dumps(i)[:40])
def test_strict_arguments_refuse_what_the_server_refuses(
    contract: dict[str, Any], instance: Any
) -> None:
    strict = {**strict_arguments(contract), **ROOT}

    by_document = jsonschema.Draft202012Validator(strict).is_valid(instance)

    assert by_document == server_accepts(contract, instance)
