"""Hostile and sloppy bodies over HTTP: each gets its exact status and error code, and
nothing is written. A 500 would fail the test (the test client re-raises it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.db.models import Model

from approvals.models import Approval, AuditEvent, Command, Epoch, Occurrence, Proposal
from tests.conftest import REFUND_ARGS, Runtime

TABLES: list[type[Model]] = [Occurrence, Proposal, AuditEvent, Approval, Command, Epoch]


def row_counts() -> dict[str, int]:
    return {model.__name__: model._default_manager.count() for model in TABLES}


@dataclass(frozen=True)
class Case:
    id: str
    body: bytes
    status: int
    code: str
    field: str | None = None
    content_type: str = "application/json"

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def propose_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tool": "issue_refund",
        "arguments": dict(REFUND_ARGS),
        "run_id": "run-1",
        "reason": "The customer asked for it.",
    }
    for key, value in changes.items():
        if value is DROP:
            del body[key]
        else:
            body[key] = value
    return body


def with_args(**changes: Any) -> bytes:
    arguments = dict(REFUND_ARGS)
    for key, value in changes.items():
        if value is DROP:
            del arguments[key]
        else:
            arguments[key] = value
    return dumps(propose_body(arguments=arguments))


def raw_args(amount: str) -> bytes:
    """A body whose amount is spelled exactly as given, which json.dumps cannot write."""
    return dumps(propose_body()).replace(b"8000", amount.encode())


DROP = object()
VALID = dumps(propose_body())

PROPOSE_CASES = [
    # Not JSON, or not JSON we accept.
    Case("malformed_json", b'{"tool": "issue_refund",', 400, "invalid_json"),
    Case("trailing_garbage", VALID + b" x", 400, "invalid_json"),
    Case("single_quotes", b"{'tool': 'issue_refund'}", 400, "invalid_json"),
    Case("not_utf8", VALID.replace(b"Damaged", b"Damag\xe9d"), 400, "invalid_encoding"),
    Case("utf16", json.dumps(propose_body()).encode("utf-16"), 400, "invalid_encoding"),
    Case("utf8_bom", b"\xef\xbb\xbf" + VALID, 400, "invalid_json"),
    Case("empty_body", b"", 400, "empty_body"),
    Case("text_plain", VALID, 415, "unsupported_media_type", content_type="text/plain"),
    Case(
        "form_encoded",
        b"tool=x",
        415,
        "unsupported_media_type",
        content_type="application/x-www-form-urlencoded",
    ),
    Case(
        "latin1_charset",
        VALID,
        415,
        "unsupported_media_type",
        content_type="application/json; charset=latin-1",
    ),
    Case("too_large", dumps(propose_body(reason="x" * 70_000)), 413, "payload_too_large"),
    # JSON, but the wrong shape.
    Case("json_array", b"[]", 422, "wrong_type", "body"),
    Case("json_array_of_body", b"[" + VALID + b"]", 422, "wrong_type", "body"),
    Case("json_string", b'"issue_refund"', 422, "wrong_type", "body"),
    Case("json_null", b"null", 422, "wrong_type", "body"),
    Case("empty_object", b"{}", 422, "missing_field", "tool"),
    Case(
        "duplicate_top_level_key",
        b'{"tool": "issue_refund", "tool": "lookup_order"}',
        422,
        "duplicate_key",
        "tool",
    ),
    Case(
        "duplicate_argument_key",
        b'{"tool": "issue_refund", "run_id": "r", "reason": "r", "arguments": {"payment_id": '
        b'"pay_1", "payment_id": "pay_2", "amount_minor": 1, "currency": "EUR", "reason": "r"}}',
        422,
        "duplicate_key",
        "arguments.payment_id",
    ),
    # Numbers JSON cannot carry, or that must be integers.
    Case("nan", raw_args("NaN"), 422, "non_finite_number", "arguments.amount_minor"),
    Case("infinity", raw_args("Infinity"), 422, "non_finite_number", "arguments.amount_minor"),
    Case(
        "minus_infinity", raw_args("-Infinity"), 422, "non_finite_number", "arguments.amount_minor"
    ),
    Case(
        "overflowing_float", raw_args("1e400"), 422, "non_finite_number", "arguments.amount_minor"
    ),
    Case("float_integral", raw_args("80.0"), 422, "float_not_allowed", "arguments.amount_minor"),
    Case("float_fraction", raw_args("80.5"), 422, "float_not_allowed", "arguments.amount_minor"),
    Case("float_exponent", raw_args("8e3"), 422, "float_not_allowed", "arguments.amount_minor"),
    Case(
        "beyond_2_53",
        raw_args(str(2**53 + 1)),
        422,
        "integer_out_of_range",
        "arguments.amount_minor",
    ),
    Case(
        "below_minus_2_53",
        raw_args(str(-(2**53) - 1)),
        422,
        "integer_out_of_range",
        "arguments.amount_minor",
    ),
    Case(
        "five_thousand_digits",
        raw_args("1" + "0" * 5000),
        422,
        "integer_out_of_range",
        "arguments.amount_minor",
    ),
    Case(
        "above_schema_maximum",
        raw_args(str(2**40)),
        422,
        "invalid_argument",
        "arguments.amount_minor",
    ),
    Case(
        "string_amount", with_args(amount_minor="80"), 422, "wrong_type", "arguments.amount_minor"
    ),
    Case(
        "boolean_amount", with_args(amount_minor=True), 422, "wrong_type", "arguments.amount_minor"
    ),
    Case(
        "negative_amount",
        with_args(amount_minor=-8000),
        422,
        "invalid_argument",
        "arguments.amount_minor",
    ),
    Case(
        "zero_amount", with_args(amount_minor=0), 422, "invalid_argument", "arguments.amount_minor"
    ),
    # Strings that could not be stored or compared safely.
    Case(
        "lone_surrogate_in_value",
        dumps(propose_body(reason="\ud800")),
        422,
        "lone_surrogate",
        "reason",
    ),
    Case(
        "lone_surrogate_in_argument",
        with_args(reason="ok \udfff"),
        422,
        "lone_surrogate",
        "arguments.reason",
    ),
    Case(
        "lone_surrogate_in_key",
        dumps(propose_body(arguments={**REFUND_ARGS, "\ud800": 1})),
        422,
        "lone_surrogate",
        "arguments.\\ud800",
    ),
    Case("nul_in_run_id", dumps(propose_body(run_id="run\u0000")), 422, "nul_character", "run_id"),
    Case("nul_in_reason", dumps(propose_body(reason="a\u0000b")), 422, "nul_character", "reason"),
    Case("nul_in_argument", with_args(reason="a\u0000b"), 422, "nul_character", "arguments.reason"),
    Case(
        "nested_too_deeply",
        dumps(propose_body(arguments={"deep": json.loads("[" * 40 + "]" * 40)})),
        422,
        "nested_too_deeply",
    ),
    Case(
        "nested_beyond_the_decoder",
        b'{"arguments": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        422,
        "nested_too_deeply",
    ),
    # The tool contract.
    Case(
        "currency_lower_case",
        with_args(currency="eur"),
        422,
        "invalid_argument",
        "arguments.currency",
    ),
    Case(
        "currency_too_short",
        with_args(currency="EU"),
        422,
        "invalid_argument",
        "arguments.currency",
    ),
    Case(
        "currency_too_long",
        with_args(currency="EURO"),
        422,
        "invalid_argument",
        "arguments.currency",
    ),
    Case(
        "missing_argument", with_args(currency=DROP), 422, "missing_argument", "arguments.currency"
    ),
    Case("extra_argument", with_args(coupon="X"), 422, "unknown_argument", "arguments.coupon"),
    Case(
        "arguments_not_object",
        dumps(propose_body(arguments=[1, 2])),
        422,
        "wrong_type",
        "arguments",
    ),
    Case("unknown_tool", dumps(propose_body(tool="format_disk")), 422, "unknown_tool", "tool"),
    # The envelope around the action.
    Case("missing_run_id", dumps(propose_body(run_id=DROP)), 422, "missing_field", "run_id"),
    Case("missing_tool", dumps(propose_body(tool=DROP)), 422, "missing_field", "tool"),
    Case(
        "unknown_top_level_field",
        dumps(propose_body(priority="high")),
        422,
        "unknown_field",
        "priority",
    ),
    Case("run_id_integer", dumps(propose_body(run_id=42)), 422, "wrong_type", "run_id"),
    Case("run_id_object", dumps(propose_body(run_id={"id": 1})), 422, "wrong_type", "run_id"),
    Case("run_id_empty", dumps(propose_body(run_id="")), 422, "too_short", "run_id"),
    Case("run_id_too_long", dumps(propose_body(run_id="r" * 201)), 422, "too_long", "run_id"),
    Case("tool_null", dumps(propose_body(tool=None)), 422, "wrong_type", "tool"),
    Case("client_ref_empty", dumps(propose_body(client_ref="")), 422, "too_short", "client_ref"),
    Case("reason_too_long", dumps(propose_body(reason="r" * 2001)), 422, "too_long", "reason"),
]


def claim_body(raw_token: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "token": raw_token,
        "action": {"tool": "issue_refund", "arguments": dict(REFUND_ARGS)},
        "execution_id": "exec-1",
    }
    for key, value in changes.items():
        if value is DROP:
            del body[key]
        else:
            body[key] = value
    return body


# Claim bodies need the real token, so each case builds its body from it.
ClaimCase = tuple[str, Callable[[str], bytes], int, str, str | None]

CLAIM_CASES: list[ClaimCase] = [
    ("malformed_json", lambda t: b'{"token": "' + t.encode(), 400, "invalid_json", None),
    ("empty_body", lambda t: b"", 400, "empty_body", None),
    ("json_array", lambda t: b"[]", 422, "wrong_type", "body"),
    ("missing_token", lambda t: dumps(claim_body(t, token=DROP)), 422, "missing_field", "token"),
    ("token_integer", lambda t: dumps(claim_body(t, token=5)), 422, "wrong_type", "token"),
    ("token_empty", lambda t: dumps(claim_body(t, token="")), 422, "too_short", "token"),
    ("token_too_long", lambda t: dumps(claim_body(t, token=t * 10)), 422, "too_long", "token"),
    ("action_list", lambda t: dumps(claim_body(t, action=[])), 422, "wrong_type", "action"),
    ("action_string", lambda t: dumps(claim_body(t, action="refund")), 422, "wrong_type", "action"),
    (
        "action_without_tool",
        lambda t: dumps(claim_body(t, action={"arguments": REFUND_ARGS})),
        422,
        "missing_field",
        "action.tool",
    ),
    (
        "action_arguments_list",
        lambda t: dumps(claim_body(t, action={"tool": "issue_refund", "arguments": []})),
        422,
        "wrong_type",
        "action.arguments",
    ),
    (
        "action_unknown_field",
        lambda t: dumps(
            claim_body(t, action={"tool": "issue_refund", "arguments": REFUND_ARGS, "x": 1})
        ),
        422,
        "unknown_field",
        "action.x",
    ),
    ("unknown_field", lambda t: dumps(claim_body(t, force=True)), 422, "unknown_field", "force"),
    (
        "missing_execution_id",
        lambda t: dumps(claim_body(t, execution_id=DROP)),
        422,
        "missing_field",
        "execution_id",
    ),
    (
        "empty_execution_id",
        lambda t: dumps(claim_body(t, execution_id="")),
        422,
        "too_short",
        "execution_id",
    ),
    (
        "nul_in_execution_id",
        lambda t: dumps(claim_body(t, execution_id="exec\u0000")),
        422,
        "nul_character",
        "execution_id",
    ),
    (
        "nul_in_message_id",
        lambda t: dumps(claim_body(t, message_id="\u0000")),
        422,
        "nul_character",
        "message_id",
    ),
    (
        "duplicate_token_key",
        lambda t: b'{"token": "apv_x", ' + dumps(claim_body(t))[1:],
        422,
        "duplicate_key",
        "token",
    ),
    (
        "nan_in_arguments",
        lambda t: dumps(claim_body(t)).replace(b"8000", b"NaN"),
        422,
        "non_finite_number",
        "action.arguments.amount_minor",
    ),
    (
        "integer_beyond_2_53",
        lambda t: dumps(claim_body(t)).replace(b"8000", str(2**60).encode()),
        422,
        "integer_out_of_range",
        "action.arguments.amount_minor",
    ),
    (
        "lone_surrogate_in_token",
        lambda t: dumps(claim_body(t + "\ud800")),
        422,
        "lone_surrogate",
        "token",
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in PROPOSE_CASES])
def test_bad_proposal_gets_its_exact_error_and_writes_nothing(runtime: Runtime, case: Case) -> None:
    before = row_counts()

    response = runtime.client.post("/api/v1/occurrences", case.body, content_type=case.content_type)

    assert (response.status_code, response.json()["error"]["code"]) == (case.status, case.code)
    assert set(response.json()) == {"error"}
    if case.field is not None:
        assert response.json()["error"]["details"][0]["field"] == case.field
    assert row_counts() == before


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [pytest.param(*case[1:], id=case[0]) for case in CLAIM_CASES],
)
def test_bad_claim_gets_its_exact_error_and_writes_nothing(
    runtime: Runtime,
    token: str,
    body: Callable[[str], bytes],
    status: int,
    code: str,
    field: str | None,
) -> None:
    before = row_counts()

    response = runtime.client.post("/api/v1/claims", body(token), content_type="application/json")

    assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    if field is not None:
        assert response.json()["error"]["details"][0]["field"] == field
    assert row_counts() == before
    assert Approval.objects.get().state == Approval.State.ISSUED


def test_the_valid_bodies_the_corpus_is_built_from_are_accepted(
    runtime: Runtime, token: str
) -> None:
    # Without this, a corpus case could pass for a reason other than the one it names.
    proposed = runtime.client.post("/api/v1/occurrences", VALID, content_type="application/json")
    claimed = runtime.client.post(
        "/api/v1/claims", dumps(claim_body(token)), content_type="application/json"
    )

    assert proposed.status_code == 201
    assert claimed.status_code == 200


def test_integer_at_2_53_minus_1_is_judged_by_the_schema_not_the_parser(
    runtime: Runtime,
) -> None:
    response = runtime.client.post(
        "/api/v1/occurrences", raw_args(str(2**53 - 1)), content_type="application/json"
    )

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_argument"


def test_integer_beyond_2_53_is_refused_where_the_schema_sets_no_maximum(
    runtime: Runtime,
) -> None:
    from approvals.models import ToolContract

    ToolContract.objects.create(
        name="count_things",
        json_schema={
            "type": "object",
            "additionalProperties": False,
            "required": ["n"],
            "properties": {"n": {"type": "integer"}},
        },
    )
    before = row_counts()

    response = runtime.post(
        "/api/v1/occurrences",
        {"tool": "count_things", "arguments": {"n": 2**53}, "run_id": "r", "reason": "r"},
    )

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "integer_out_of_range"
    assert row_counts() == before
    assert (
        runtime.post(
            "/api/v1/occurrences",
            {"tool": "count_things", "arguments": {"n": 2**53 - 1}, "run_id": "r", "reason": "r"},
        ).status_code
        == 201
    )


def test_body_of_exactly_64_kib_is_read_and_one_byte_more_is_413(runtime: Runtime) -> None:
    def body_of(size: int) -> bytes:
        body = dumps(propose_body(reason=""))
        padded = dumps(propose_body(reason="x" * (size - len(body))))
        assert len(padded) == size
        return padded

    at_limit = runtime.client.post(
        "/api/v1/occurrences", body_of(64 * 1024), content_type="application/json"
    )
    over_limit = runtime.client.post(
        "/api/v1/occurrences", body_of(64 * 1024 + 1), content_type="application/json"
    )

    assert (at_limit.status_code, at_limit.json()["error"]["code"]) == (422, "too_long")
    assert (over_limit.status_code, over_limit.json()["error"]["code"]) == (
        413,
        "payload_too_large",
    )


def test_charset_utf8_parameter_is_accepted(runtime: Runtime) -> None:
    response = runtime.client.post(
        "/api/v1/occurrences", VALID, content_type="application/json; charset=UTF-8"
    )

    assert response.status_code == 201


def test_every_error_names_every_broken_argument(runtime: Runtime) -> None:
    response = runtime.client.post(
        "/api/v1/occurrences",
        with_args(amount_minor=80.5, currency="eur", coupon="X"),
        content_type="application/json",
    )

    fields = {(d["field"], d["code"]) for d in response.json()["error"]["details"]}
    assert fields == {
        ("arguments.amount_minor", "float_not_allowed"),
        ("arguments.currency", "invalid_argument"),
        ("arguments.coupon", "unknown_argument"),
    }


def test_error_messages_do_not_echo_the_token(runtime: Runtime, token: str) -> None:
    for body in (
        claim_body(token, execution_id=""),
        claim_body(token, action=[]),
        claim_body(token, execution_id="\u0000"),
    ):
        response = runtime.post("/api/v1/claims", body)
        assert response.status_code == 422
        assert token not in response.content.decode()
