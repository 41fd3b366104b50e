"""The agent API over HTTP: the shapes a runtime relies on, one behaviour per test."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals.access import tokens
from approvals.models import Approval, AuditEvent, Command, Occurrence, Proposal, RuntimeKey
from approvals.reviews.decisions import occurrence_reject
from approvals.reviews.revocation import approval_revoke
from tests.conftest import REFUND_ARGS, Runtime, approve

REFUND_CANONICAL = (
    '{"arguments":{"amount_minor":8000,"currency":"EUR","payment_id":"pay_123",'
    '"reason":"Damaged parcel"},"tool":"issue_refund"}'
)


def error_of(response: Any) -> dict[str, Any]:
    """The error envelope's inner object, after checking the envelope has no other keys."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"code", "message"} <= set(body["error"]) <= {"code", "message", "details"}
    error: dict[str, Any] = body["error"]
    return error


def refusal_of(response: Any) -> dict[str, Any]:
    """A claim refusal's ``decision`` and ``reason``, after checking the error envelope that
    carries the same refusal beside them."""
    body = response.json()
    assert set(body) == {"decision", "reason", "error"}, body
    assert body["error"]["code"] == body["decision"]
    return {"decision": body["decision"], "reason": body["reason"]}


def ndjson(response: Any) -> list[dict[str, Any]]:
    assert response["Content-Type"] == "application/x-ndjson"
    text = b"".join(response.streaming_content).decode()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


# --- proposing ------------------------------------------------------------------------


def test_propose_returns_201_with_pending_status_and_the_canonical_proposal(
    runtime: Runtime,
) -> None:
    response = runtime.propose(requested_by="alice", client_ref="ref-1")

    assert response.status_code == 201
    body = response.json()
    occurrence = Occurrence.objects.get()
    assert body == {
        "occurrence_id": str(occurrence.pk),
        "status": "pending_review",
        "proposal": {
            "version": 1,
            "action_digest": hashlib.sha256(REFUND_CANONICAL.encode()).hexdigest(),
            "canonical_action": REFUND_CANONICAL,
            "arguments": REFUND_ARGS,
            "edited_by": None,
        },
        "rejection_reason": "",
        "prior_decisions": [],
    }
    assert (occurrence.requested_by, occurrence.client_ref, occurrence.run_id) == (
        "alice",
        "ref-1",
        "run-1",
    )
    assert occurrence.runtime_key == runtime.key


def test_propose_again_with_same_client_ref_returns_200_and_the_same_occurrence(
    runtime: Runtime,
) -> None:
    first = runtime.propose(client_ref="ref-1")
    counts = (Occurrence.objects.count(), Proposal.objects.count(), AuditEvent.objects.count())

    again = runtime.propose(client_ref="ref-1")

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json() == first.json()
    assert (
        (
            Occurrence.objects.count(),
            Proposal.objects.count(),
            AuditEvent.objects.count(),
        )
        == counts
        == (1, 1, 1)
    )


def test_same_client_ref_with_a_different_action_gets_409_client_ref_conflict(
    runtime: Runtime,
) -> None:
    assert runtime.propose(client_ref="ref-1").status_code == 201

    response = runtime.propose(arguments={**REFUND_ARGS, "amount_minor": 9000}, client_ref="ref-1")

    assert response.status_code == 409
    assert error_of(response)["code"] == "client_ref_conflict"
    assert Occurrence.objects.count() == 1
    assert Proposal.objects.count() == 1


def test_client_ref_is_scoped_to_the_tenant(runtime: Runtime, other_runtime: Runtime) -> None:
    mine = runtime.propose(client_ref="ref-1")
    theirs = other_runtime.propose(client_ref="ref-1")

    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["occurrence_id"] != theirs.json()["occurrence_id"]


def test_read_only_lookup_is_auto_admitted_with_its_justification_recorded(
    runtime: Runtime,
) -> None:
    response = runtime.propose("lookup_order", {"order_id": "1042"})

    assert response.status_code == 201
    assert response.json()["status"] == "auto_admitted"
    occurrence = Occurrence.objects.get()
    assert occurrence.status == Occurrence.Status.AUTO_ADMITTED
    assert occurrence.admission_justification
    admitted = AuditEvent.objects.get(occurrence=occurrence, kind="occurrence.auto_admitted")
    assert (admitted.decision, admitted.reason_code) == ("auto_admitted", "policy_read_only")
    assert admitted.data["justification"]


def test_token_pickup_for_an_auto_admitted_call_is_refused(runtime: Runtime) -> None:
    occurrence_id = runtime.propose("lookup_order", {"order_id": "1042"}).json()["occurrence_id"]

    response = runtime.token(occurrence_id)

    assert response.status_code == 409
    assert error_of(response)["code"] == "auto_admitted"


def test_refund_is_left_for_review(runtime: Runtime) -> None:
    response = runtime.propose()

    assert response.json()["status"] == "pending_review"
    assert not AuditEvent.objects.filter(kind="occurrence.auto_admitted").exists()


# --- reading an occurrence -----------------------------------------------------------


def test_detail_of_a_pending_occurrence_has_no_approval_commands_or_epochs(
    runtime: Runtime,
) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]

    response = runtime.get(f"/api/v1/occurrences/{occurrence_id}")

    assert response.status_code == 200
    body = response.json()
    assert body["occurrence_id"] == occurrence_id
    assert body["status"] == "pending_review"
    assert body["tool"] == "issue_refund"
    assert body["proposal"]["version"] == 1
    assert body["proposal"]["canonical_action"] == REFUND_CANONICAL
    assert body["approval"] is None
    assert body["commands"] == []
    assert body["epochs"] == []


def test_detail_after_claim_shows_approval_command_and_epoch_but_never_the_token(
    runtime: Runtime, approved: str, token: str
) -> None:
    claim = runtime.claim(token, "exec-a").json()

    response = runtime.get(f"/api/v1/occurrences/{approved}")

    assert response.status_code == 200
    body = response.json()
    approval = Approval.objects.get()
    assert body["status"] == "claimed"
    assert body["approval"]["state"] == "consumed"
    assert body["approval"]["fingerprint"] == tokens.fingerprint(token)
    assert body["approval"]["expires_at"].startswith(approval.expires_at.strftime("%Y-%m-%dT%H:%M"))
    assert body["approval"]["consumed_by_execution"] == "exec-a"
    assert body["commands"] == [
        {
            "id": claim["command_id"],
            "idempotency_key": claim["idempotency_key"],
            "state": "pending",
            "effect_state": "not_sent",
            "executed_by": "console",
            "execution_id": "exec-a",
        }
    ]
    assert [(e["number"], e["execution_id"], e["justification"]) for e in body["epochs"]] == [
        (1, "exec-a", "approval")
    ]
    assert token not in response.content.decode()
    assert approval.token_hash is not None
    assert approval.token_hash not in response.content.decode()


def test_detail_of_an_approved_occurrence_shows_the_issued_approval(
    runtime: Runtime, approved: str
) -> None:
    body = runtime.get(f"/api/v1/occurrences/{approved}").json()

    assert body["status"] == "approved"
    assert body["approval"]["state"] == "issued"
    assert body["approval"]["fingerprint"] is None
    assert body["approval"]["token_delivered"] is False


def test_another_tenants_occurrence_is_404_with_the_error_envelope(
    runtime: Runtime, other_runtime: Runtime
) -> None:
    theirs = other_runtime.propose().json()["occurrence_id"]

    response = runtime.get(f"/api/v1/occurrences/{theirs}")

    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"
    assert theirs not in response.content.decode()


# An id no row has. Fixed, not uuid4(): it is part of the test ids, which every pytest-xdist
# worker must collect alike.
UNKNOWN_ID = "5f0c6a52-3a5e-4d36-9d0e-7c1d2b6a9e41"


@pytest.mark.parametrize("occurrence_id", ["not-a-uuid", "1", "x" * 300, UNKNOWN_ID])
def test_unknown_or_malformed_occurrence_id_is_404(runtime: Runtime, occurrence_id: str) -> None:
    response = runtime.get(f"/api/v1/occurrences/{occurrence_id}")

    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


# --- token pickup ---------------------------------------------------------------------


def test_first_pickup_after_approval_returns_the_token_once(
    runtime: Runtime, approved: str
) -> None:
    response = runtime.token(approved)

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"token", "fingerprint", "expires_at", "execution_id", "redelivered"}
    assert body["execution_id"] is None and body["redelivered"] is False
    approval = Approval.objects.get()
    assert body["fingerprint"] == approval.fingerprint == tokens.fingerprint(body["token"])
    assert body["expires_at"].startswith(approval.expires_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert approval.delivered_at is not None


def test_token_has_256_bits_from_secrets(
    runtime: Runtime, approved: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    requested: list[int | None] = []
    token_urlsafe = secrets.token_urlsafe

    def spy(nbytes: int | None = None) -> str:
        requested.append(nbytes)
        return token_urlsafe(nbytes)

    monkeypatch.setattr(tokens.secrets, "token_urlsafe", spy)

    token = runtime.token(approved).json()["token"]

    assert requested == [32]
    assert token.startswith(tokens.APPROVAL_TOKEN_PREFIX)
    body = token.removeprefix(tokens.APPROVAL_TOKEN_PREFIX)
    assert len(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))) * 8 >= 256


def test_only_the_tokens_sha256_is_stored(runtime: Runtime, approved: str) -> None:
    token = runtime.token(approved).json()["token"]

    approval = Approval.objects.get()
    assert approval.token_hash == hashlib.sha256(token.encode()).hexdigest()
    for field in Approval._meta.concrete_fields:
        assert token not in str(field.value_from_object(approval)), field.name


def test_second_pickup_gets_token_already_delivered(runtime: Runtime, approved: str) -> None:
    first = runtime.token(approved)
    stored_hash = Approval.objects.get().token_hash

    second = runtime.token(approved)

    assert first.status_code == 200
    assert second.status_code == 409
    assert error_of(second)["code"] == "token_already_delivered"
    assert first.json()["token"] not in second.content.decode()
    assert Approval.objects.get().token_hash == stored_hash


def test_pickup_before_approval_gets_not_approved(runtime: Runtime) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]

    response = runtime.token(occurrence_id)

    assert response.status_code == 409
    assert error_of(response)["code"] == "not_approved"
    assert not Approval.objects.exists()


def test_pickup_after_rejection_gets_rejected_with_the_reviewers_reason(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id),
        reviewer=reviewer,
        reason="Order 1042 was already refunded",
    )

    response = runtime.token(occurrence_id)

    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "rejected"
    assert "Order 1042 was already refunded" in error["message"]


def test_pickup_after_expiry_gets_expired(runtime: Runtime, approved: str) -> None:
    past = timezone.now() - timedelta(hours=1)
    Approval.objects.update(issued_at=past - timedelta(minutes=15), expires_at=past)

    response = runtime.token(approved)

    assert response.status_code == 409
    assert error_of(response)["code"] == "expired"
    assert Approval.objects.get().token_hash is None


def test_pickup_of_another_tenants_occurrence_is_404(other_runtime: Runtime, approved: str) -> None:
    response = other_runtime.token(approved)

    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"
    assert Approval.objects.get().token_hash is None


# --- claims --------------------------------------------------------------------------


def test_claim_with_a_fresh_token_is_approved_with_a_new_command(
    runtime: Runtime, token: str
) -> None:
    response = runtime.claim(token, "exec-a", message_id="msg-1")

    assert response.status_code == 200
    body = response.json()
    command = Command.objects.get()
    assert body == {
        "decision": "approved",
        "command_id": str(command.pk),
        "idempotency_key": command.idempotency_key,
        "executed_by": "console",
    }
    assert AuditEvent.objects.get(kind="claim.approved").message_id == "msg-1"


def test_claim_redelivered_to_the_same_execution_is_duplicate_delivery_of_the_same_command(
    runtime: Runtime, token: str
) -> None:
    first = runtime.claim(token, "exec-a").json()

    response = runtime.claim(token, "exec-a")

    assert response.status_code == 200
    assert response.json() == {**first, "decision": "duplicate_delivery"}
    assert Command.objects.count() == 1


def test_claim_by_a_second_execution_is_403_replayed(runtime: Runtime, token: str) -> None:
    runtime.claim(token, "exec-a")

    response = runtime.claim(token, "exec-b")

    assert response.status_code == 403
    assert refusal_of(response) == {"decision": "replayed", "reason": "consumed_by_other_execution"}
    assert Command.objects.count() == 1


def test_claim_with_an_unknown_token_is_403_unknown_token(runtime: Runtime, token: str) -> None:
    response = runtime.claim("apv_" + secrets.token_urlsafe(32), "exec-a")

    assert response.status_code == 403
    assert refusal_of(response) == {"decision": "unknown_token", "reason": "no_such_token"}
    assert Approval.objects.get().state == Approval.State.ISSUED


def test_claim_with_another_tenants_token_is_unknown_token(
    other_runtime: Runtime, token: str
) -> None:
    response = other_runtime.claim(token, "exec-a")

    assert response.status_code == 403
    assert response.json()["decision"] == "unknown_token"
    assert Approval.objects.get().state == Approval.State.ISSUED
    assert not Command.objects.exists()


def test_claim_with_a_different_action_is_scope_mismatch_and_leaves_the_token_unused(
    runtime: Runtime, token: str
) -> None:
    response = runtime.claim(token, "exec-a", arguments={**REFUND_ARGS, "amount_minor": 8001})

    assert response.status_code == 403
    assert refusal_of(response) == {"decision": "scope_mismatch", "reason": "action_differs"}
    assert Approval.objects.get().state == Approval.State.ISSUED
    assert runtime.claim(token, "exec-a").json()["decision"] == "approved"


def test_claim_after_revocation_is_403_revoked(
    runtime: Runtime, token: str, admin_user: Any
) -> None:
    assert approval_revoke(approval=Approval.objects.get(), admin=admin_user, reason="incident")

    response = runtime.claim(token, "exec-a")

    assert response.status_code == 403
    assert refusal_of(response) == {"decision": "revoked", "reason": "revoked_by_admin"}


def test_claim_after_expiry_is_403_expired(runtime: Runtime, token: str) -> None:
    past = timezone.now() - timedelta(hours=1)
    Approval.objects.update(issued_at=past - timedelta(minutes=15), expires_at=past)

    response = runtime.claim(token, "exec-a")

    assert response.status_code == 403
    assert refusal_of(response) == {"decision": "expired", "reason": "expired"}
    assert not Command.objects.exists()


# --- audit stream --------------------------------------------------------------------


def test_audit_events_stream_as_ndjson_in_cursor_order(runtime: Runtime, token: str) -> None:
    runtime.claim(token, "exec-a")

    response = runtime.get("/api/v1/audit/events")

    assert response.status_code == 200
    events = ndjson(response)
    expected = list(AuditEvent.objects.order_by("id"))
    assert [e["cursor"] for e in events] == [e.pk for e in expected]
    assert [e["kind"] for e in events] == [e.kind for e in expected]
    assert [e["kind"] for e in events][-1] == "claim.approved"
    assert events[-1]["command_id"] == str(Command.objects.get().pk)


def test_audit_stream_holds_only_this_tenants_events(
    runtime: Runtime, other_runtime: Runtime
) -> None:
    runtime.propose()
    other_runtime.propose()
    other_runtime.propose("lookup_order", {"order_id": "7"})

    mine = ndjson(runtime.get("/api/v1/audit/events"))
    theirs = ndjson(other_runtime.get("/api/v1/audit/events"))

    assert {e["cursor"] for e in mine} == set(
        AuditEvent.objects.filter(tenant=runtime.key.tenant).values_list("id", flat=True)
    )
    assert len(mine) == 1
    assert len(theirs) == 3
    assert not {e["cursor"] for e in mine} & {e["cursor"] for e in theirs}


def test_audit_cursor_pages_through_the_stream(runtime: Runtime) -> None:
    for n in range(5):
        runtime.propose(client_ref=f"ref-{n}")
    everything = ndjson(runtime.get("/api/v1/audit/events"))

    first_page = ndjson(runtime.get("/api/v1/audit/events?limit=2"))
    second_page = ndjson(runtime.get(f"/api/v1/audit/events?after={first_page[-1]['cursor']}"))
    empty = ndjson(runtime.get(f"/api/v1/audit/events?after={everything[-1]['cursor']}"))

    assert len(everything) == 5
    assert first_page == everything[:2]
    assert second_page == everything[2:]
    assert empty == []


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("after=abc", "wrong_type"),
        ("after=1.5", "wrong_type"),
        ("after=-1", "out_of_range"),
        ("after=99999999999999999999999", "out_of_range"),
        ("limit=0", "out_of_range"),
    ],
)
def test_bad_audit_cursor_is_422_with_the_error_envelope(
    runtime: Runtime, query: str, code: str
) -> None:
    runtime.propose()

    response = runtime.get(f"/api/v1/audit/events?{query}")

    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == code
    assert error["details"][0]["field"] == query.split("=")[0]


# --- the API as a whole ----------------------------------------------------------------


# The document describes the tool contracts, read from the database.
@pytest.mark.django_db
def test_openapi_schema_lists_every_endpoint(client: Any) -> None:
    response = client.get("/api/v1/openapi.json")

    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert {
        "/api/v1/occurrences": {"get", "post"},
        "/api/v1/occurrences/{occurrence_id}": {"get"},
        "/api/v1/occurrences/{occurrence_id}/renew": {"post"},
        "/api/v1/occurrences/{occurrence_id}/decisions": {"post"},
        "/api/v1/callback": {"get", "put", "delete"},
        "/api/v1/occurrences/{occurrence_id}/token": {"post"},
        "/api/v1/tools": {"get"},
        "/api/v1/tools/{name}": {"get"},
        "/api/v1/actions/canonicalize": {"post"},
        "/api/v1/claims": {"post"},
        "/api/v1/audit/events": {"get", "post"},
        "/api/v1/audit/events/cursor": {"get"},
        "/api/v1/commands/{command_id}": {"get"},
        "/api/v1/commands/{command_id}/effect": {"post"},
        "/api/v1/occurrences/{occurrence_id}/epochs": {"post"},
    } == {path: set(ops) for path, ops in schema["paths"].items()}


ENDPOINTS = [
    ("post", "/api/v1/occurrences"),
    ("get", "/api/v1/occurrences?run_id=run-1&client_ref=call_0"),
    ("get", f"/api/v1/occurrences/{UNKNOWN_ID}"),
    ("post", f"/api/v1/occurrences/{UNKNOWN_ID}/renew"),
    ("get", "/api/v1/tools"),
    ("get", "/api/v1/tools/issue_refund"),
    ("post", "/api/v1/actions/canonicalize"),
    ("post", f"/api/v1/occurrences/{UNKNOWN_ID}/token"),
    ("post", "/api/v1/claims"),
    ("get", "/api/v1/audit/events"),
    ("get", f"/api/v1/commands/{UNKNOWN_ID}"),
    ("post", f"/api/v1/commands/{UNKNOWN_ID}/effect"),
    ("post", f"/api/v1/occurrences/{UNKNOWN_ID}/epochs"),
]


def _call(client: Any, method: str, path: str, **extra: Any) -> Any:
    if method == "post":
        return client.post(path, "{}", content_type="application/json", **extra)
    return client.get(path, **extra)


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer", "Bearer rk_not-a-real-key", "Basic dXNlcjpwYXNz", "bearer"],
)
def test_missing_or_invalid_key_is_401_with_the_error_envelope(
    client: Any, runtime: Runtime, method: str, path: str, authorization: str | None
) -> None:
    extra = {} if authorization is None else {"HTTP_AUTHORIZATION": authorization}

    response = _call(client, method, path, **extra)

    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_inactive_key_is_401(runtime: Runtime, method: str, path: str) -> None:
    RuntimeKey.objects.filter(pk=runtime.key.pk).update(is_active=False)

    response = _call(runtime.client, method, path)

    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthenticated"


def test_key_works_until_deactivated(runtime: Runtime) -> None:
    assert runtime.get("/api/v1/audit/events").status_code == 200
    RuntimeKey.objects.filter(pk=runtime.key.pk).update(is_active=False)

    assert runtime.get("/api/v1/audit/events").status_code == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/api/v1/claims"), ("put", "/api/v1/occurrences"), ("delete", "/api/v1/claims")],
)
def test_wrong_method_is_405_with_the_error_envelope(
    runtime: Runtime, method: str, path: str
) -> None:
    response = getattr(runtime.client, method)(path)

    assert response.status_code == 405
    assert error_of(response)["code"] == "method_not_allowed"
    assert response["Allow"]


def test_unknown_api_path_is_404_with_the_error_envelope(runtime: Runtime) -> None:
    response = runtime.get("/api/v1/nothing-here")

    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


def _propose_with_trace_id(runtime: Runtime, trace_id: str) -> Any:
    body = {"tool": "issue_refund", "arguments": REFUND_ARGS, "run_id": "r", "reason": "r"}
    return runtime.post("/api/v1/occurrences", body, HTTP_X_TRACE_ID=trace_id)


def test_a_well_formed_trace_id_is_echoed_and_recorded_in_the_audit_event(
    runtime: Runtime,
) -> None:
    response = _propose_with_trace_id(runtime, "trace-abc.123")

    assert response["X-Trace-Id"] == "trace-abc.123"
    assert AuditEvent.objects.get().trace_id == "trace-abc.123"


def test_a_malformed_trace_id_is_replaced(runtime: Runtime) -> None:
    response = _propose_with_trace_id(runtime, "bad trace <id>")

    trace_id = response["X-Trace-Id"]
    assert trace_id != "bad trace <id>"
    assert len(trace_id) == 32
    assert AuditEvent.objects.get().trace_id == trace_id


def test_approval_through_the_quorum_still_issues_one_token(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = runtime.propose(arguments={**REFUND_ARGS, "amount_minor": 60000}).json()[
        "occurrence_id"
    ]
    assert not approve(occurrence_id, reviewer).issued
    assert runtime.token(occurrence_id).json()["error"]["code"] == "not_approved"

    assert approve(occurrence_id, second_reviewer).issued

    assert runtime.token(occurrence_id).status_code == 200
    assert runtime.token(occurrence_id).status_code == 409


# --- query counts ----------------------------------------------------------------------


def test_detail_reads_a_fixed_number_of_queries(
    runtime: Runtime, approved: str, token: str, django_assert_num_queries: Any
) -> None:
    runtime.claim(token, "exec-a")

    # The key (with its tenant), its rate-limit counter (one upsert), the occurrence (with
    # its tool), then one query each for proposals, approvals, commands and epochs: never
    # one per row.
    with django_assert_num_queries(7):
        response = runtime.get(f"/api/v1/occurrences/{approved}")

    assert response.status_code == 200
    body = response.json()
    assert (body["occurrence_id"], body["status"]) == (approved, "claimed")
    assert body["command"]["execution_id"] == "exec-a"
    assert [epoch["execution_id"] for epoch in body["epochs"]] == ["exec-a"]


def test_audit_stream_reads_a_fixed_number_of_queries_however_many_events(
    runtime: Runtime, django_assert_num_queries: Any
) -> None:
    for n in range(30):
        runtime.propose(client_ref=f"ref-{n}")
    # The key's first use is written down, and the export chains what is new before it
    # answers: measure an export that has neither to do.
    assert len(ndjson(runtime.get("/api/v1/audit/events"))) == 30
    thirty: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        thirty.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        ndjson(runtime.get("/api/v1/audit/events"))
    for n in range(30, 60):
        runtime.propose(client_ref=f"ref-{n}")
    ndjson(runtime.get("/api/v1/audit/events?limit=1"))

    with django_assert_num_queries(len(thirty)):
        response = runtime.get("/api/v1/audit/events")
        events = ndjson(response)

    assert response.status_code == 200
    assert len(events) == 60
