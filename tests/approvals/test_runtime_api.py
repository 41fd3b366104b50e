"""The runtime API made crash-safe: lookup without creating, idempotency per run, what was
approved, prior rejections, renewal after expiry, one error envelope, tool contracts."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Command,
    Occurrence,
    Proposal,
    ToolContract,
)
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from approvals.reviews.expiry import approvals_expire
from approvals.reviews.revocation import approvals_revoke
from approvals.web.presenters.review import quorum_rule
from tests.conftest import REFUND_ARGS, Runtime, approve

pytestmark = pytest.mark.django_db

REFUND_CANONICAL = (
    '{"arguments":{"amount_minor":8000,"currency":"EUR","payment_id":"pay_123",'
    '"reason":"Damaged parcel"},"tool":"issue_refund"}'
)
REFUND_DIGEST = hashlib.sha256(REFUND_CANONICAL.encode()).hexdigest()


def envelope(response: Any) -> dict[str, Any]:
    """The error object, after checking the envelope: exactly code, message and details."""
    body = response.json()
    assert "error" in body, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["details"] is None or isinstance(error["details"], list | dict)
    return error


def error_only(response: Any) -> dict[str, Any]:
    assert set(response.json()) == {"error"}, response.json()
    return envelope(response)


def counts() -> tuple[int, ...]:
    return (
        Occurrence.objects.count(),
        Proposal.objects.count(),
        Approval.objects.count(),
        Command.objects.count(),
        AuditEvent.objects.count(),
    )


def detail(runtime: Runtime, occurrence_id: str) -> dict[str, Any]:
    response = runtime.get(f"/api/v1/occurrences/{occurrence_id}")
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


def lookup(runtime: Runtime, **params: str) -> Any:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return runtime.get(f"/api/v1/occurrences?{query}")


def expire(occurrence_id: str) -> None:
    """Put the occurrence's approvals past their expiry (still ``issued``: before the sweep)."""
    past = timezone.now() - timedelta(minutes=1)
    Approval.objects.filter(occurrence_id=occurrence_id).update(
        issued_at=past - timedelta(minutes=15), expires_at=past
    )


def reject(occurrence_id: str, reviewer: Any, reason: str) -> None:
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason=reason
    )


def renew(runtime: Runtime, occurrence_id: str) -> Any:
    return runtime.post(f"/api/v1/occurrences/{occurrence_id}/renew")


# --- lookup and idempotency per run ----------------------------------------------------


def test_lookup_returns_the_same_body_as_the_detail_and_creates_nothing(
    runtime: Runtime, approved: str
) -> None:
    Occurrence.objects.filter(pk=approved).update(client_ref="call_0")
    before = counts()

    response = lookup(runtime, run_id="run-1", client_ref="call_0")

    assert response.status_code == 200
    assert response.json() == detail(runtime, approved)
    assert counts() == before


def test_lookup_of_nothing_is_404_and_creates_nothing(runtime: Runtime) -> None:
    runtime.propose(client_ref="call_0")
    before = counts()

    for params in (
        {"run_id": "run-1", "client_ref": "call_1"},
        {"run_id": "run-2", "client_ref": "call_0"},
    ):
        response = lookup(runtime, **params)
        assert response.status_code == 404
        assert error_only(response)["code"] == "not_found"
    assert counts() == before


def test_lookup_never_finds_another_tenants_occurrence(
    runtime: Runtime, other_runtime: Runtime
) -> None:
    other_runtime.propose(client_ref="call_0")

    response = lookup(runtime, run_id="run-1", client_ref="call_0")

    assert response.status_code == 404
    assert error_only(response)["code"] == "not_found"


@pytest.mark.parametrize(
    ("query", "field"),
    [("run_id=run-1", "client_ref"), ("client_ref=call_0", "run_id"), ("", "run_id")],
)
def test_lookup_without_both_parameters_is_422_naming_the_missing_one(
    runtime: Runtime, query: str, field: str
) -> None:
    response = runtime.get(f"/api/v1/occurrences?{query}")

    assert response.status_code == 422
    error = error_only(response)
    assert error["code"] == "missing_field"
    assert field in {d["field"] for d in error["details"]}


def test_two_runs_reusing_call_0_get_two_occurrences(runtime: Runtime) -> None:
    first = runtime.propose(run_id="conversation-a", client_ref="call_0")
    second = runtime.propose(run_id="conversation-b", client_ref="call_0")

    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["occurrence_id"] != second.json()["occurrence_id"]
    assert Occurrence.objects.count() == 2
    found_a = lookup(runtime, run_id="conversation-a", client_ref="call_0").json()
    found_b = lookup(runtime, run_id="conversation-b", client_ref="call_0").json()
    assert found_a["occurrence_id"] == first.json()["occurrence_id"]
    assert found_b["occurrence_id"] == second.json()["occurrence_id"]


def test_a_second_run_does_not_inherit_the_first_runs_approval(
    runtime: Runtime, reviewer: Any
) -> None:
    first = runtime.propose(run_id="conversation-a", client_ref="call_0").json()
    assert approve(first["occurrence_id"], reviewer).issued

    second = runtime.propose(run_id="conversation-b", client_ref="call_0").json()

    assert second["status"] == "pending_review"
    pickup = runtime.token(second["occurrence_id"])
    assert pickup.status_code == 409
    assert envelope(pickup)["code"] == "not_approved"


def test_same_run_same_client_ref_same_action_is_the_same_occurrence(runtime: Runtime) -> None:
    first = runtime.propose(run_id="conversation-a", client_ref="call_0")
    before = counts()

    again = runtime.propose(run_id="conversation-a", client_ref="call_0")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert counts() == before


def test_same_run_same_client_ref_different_action_is_409_client_ref_conflict(
    runtime: Runtime,
) -> None:
    first = runtime.propose(run_id="conversation-a", client_ref="call_0").json()
    before = counts()

    response = runtime.propose(
        arguments={**REFUND_ARGS, "amount_minor": 9000},
        run_id="conversation-a",
        client_ref="call_0",
    )

    assert response.status_code == 409
    error = error_only(response)
    assert error["code"] == "client_ref_conflict"
    assert error["details"] == {"occurrence_id": first["occurrence_id"]}
    assert counts() == before


def test_the_database_refuses_a_second_occurrence_of_one_run_and_client_ref(
    runtime: Runtime,
) -> None:
    first = Occurrence.objects.get(pk=runtime.propose(client_ref="call_0").json()["occurrence_id"])
    Occurrence.objects.create(
        tenant=first.tenant, tool=first.tool, run_id="run-2", client_ref="call_0"
    )

    with pytest.raises(IntegrityError), transaction.atomic():
        Occurrence.objects.create(
            tenant=first.tenant, tool=first.tool, run_id="run-1", client_ref="call_0"
        )
    # Without a client_ref, nothing is unique.
    for _ in range(2):
        Occurrence.objects.create(tenant=first.tenant, tool=first.tool, run_id="run-1")


# --- what was approved -------------------------------------------------------------------


def test_a_pending_occurrence_shows_its_arguments_digest_and_no_editor(runtime: Runtime) -> None:
    proposed = runtime.propose().json()

    body = detail(runtime, proposed["occurrence_id"])

    assert body["proposal"] == {
        "version": 1,
        "action_digest": REFUND_DIGEST,
        "canonical_action": REFUND_CANONICAL,
        "arguments": REFUND_ARGS,
        "edited_by": None,
    }
    assert proposed["proposal"] == body["proposal"]
    assert (body["approval"], body["command"], body["commands"]) == (None, None, [])


def test_a_reviewers_edit_shows_the_new_arguments_digest_version_and_editor(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]
    edited = {**REFUND_ARGS, "amount_minor": 7000}
    proposal_edit(
        occurrence=Occurrence.objects.get(pk=occurrence_id),
        editor=reviewer,
        arguments=edited,
        seen_digest=REFUND_DIGEST,
    )
    assert approve(occurrence_id, second_reviewer).issued

    body = detail(runtime, occurrence_id)

    proposal = Proposal.objects.get(occurrence_id=occurrence_id, is_current=True)
    assert body["proposal"]["version"] == 2
    assert body["proposal"]["arguments"] == edited
    assert body["proposal"]["action_digest"] == proposal.action_digest != REFUND_DIGEST
    assert body["proposal"]["edited_by"] == "rita"
    assert body["approval"]["state"] == "issued"
    # A runtime compares before picking up: the approved action is not the one it proposed.
    assert body["proposal"]["arguments"] != REFUND_ARGS


def test_after_a_claim_the_answer_carries_the_command_and_its_effect(
    runtime: Runtime, approved: str, token: str
) -> None:
    claim = runtime.claim(token, "exec-a").json()

    body = detail(runtime, approved)

    assert body["status"] == "claimed"
    assert body["approval"]["state"] == "consumed"
    assert body["command"] == body["commands"][-1]
    assert body["command"]["id"] == claim["command_id"]
    assert body["command"]["effect_state"] == "not_sent"

    Command.objects.update(state=Command.State.COMMITTED)
    assert detail(runtime, approved)["command"]["effect_state"] == "committed"


# --- repeats of a rejected action ----------------------------------------------------------


def test_a_repeat_of_a_rejected_action_lists_the_prior_rejection(
    runtime: Runtime, reviewer: Any
) -> None:
    first = runtime.propose(client_ref="call_0").json()["occurrence_id"]
    reject(first, reviewer, "Order 1042 was already refunded")
    rejected_at = Occurrence.objects.get(pk=first).decided_at
    assert rejected_at is not None

    response = runtime.propose(client_ref="call_1")

    assert response.status_code == 201
    body = response.json()
    assert body["status"] == "pending_review"
    assert body["prior_decisions"] == [
        {
            "occurrence_id": first,
            "decision": "rejected",
            "reason": "Order 1042 was already refunded",
            "decided_at": body["prior_decisions"][0]["decided_at"],
            "decided_by": "rita",
        }
    ]
    assert body["prior_decisions"][0]["decided_at"].startswith(
        rejected_at.strftime("%Y-%m-%dT%H:%M:%S")
    )


def test_prior_decisions_are_newest_first_and_only_of_the_same_run_and_action(
    runtime: Runtime, reviewer: Any
) -> None:
    older = runtime.propose(client_ref="a").json()["occurrence_id"]
    reject(older, reviewer, "first no")
    newer = runtime.propose(client_ref="b").json()["occurrence_id"]
    reject(newer, reviewer, "second no")
    other_run = runtime.propose(client_ref="c", run_id="run-2").json()["occurrence_id"]
    reject(other_run, reviewer, "other run")
    other_action = runtime.propose(
        client_ref="d", arguments={**REFUND_ARGS, "amount_minor": 1}
    ).json()["occurrence_id"]
    reject(other_action, reviewer, "other action")
    runtime.propose(client_ref="e")  # the same action, pending: not a decision

    body = runtime.propose(client_ref="f").json()

    assert [(p["occurrence_id"], p["reason"]) for p in body["prior_decisions"]] == [
        (newer, "second no"),
        (older, "first no"),
    ]
    assert runtime.propose(client_ref="g", run_id="run-3").json()["prior_decisions"] == []


def test_a_first_proposal_has_no_prior_decisions(runtime: Runtime) -> None:
    assert runtime.propose().json()["prior_decisions"] == []


def test_a_contract_that_rejects_repeats_rejects_one_without_review_recorded(
    runtime: Runtime, reviewer: Any
) -> None:
    ToolContract.objects.filter(name="issue_refund").update(reject_repeats=True)
    first = runtime.propose(client_ref="call_0").json()["occurrence_id"]
    reject(first, reviewer, "Order 1042 was already refunded")

    response = runtime.propose(client_ref="call_1")

    assert response.status_code == 201
    body = response.json()
    assert body["status"] == "rejected"
    assert body["rejection_reason"] == "Order 1042 was already refunded"
    assert [p["occurrence_id"] for p in body["prior_decisions"]] == [first]
    repeat = Occurrence.objects.get(pk=body["occurrence_id"])
    assert repeat.status == Occurrence.Status.REJECTED
    assert repeat.rejection_reason == "Order 1042 was already refunded"
    assert repeat.decided_at is not None
    event = AuditEvent.objects.get(occurrence=repeat, kind="occurrence.rejected")
    assert (event.actor, event.decision, event.reason_code) == (
        "policy",
        "rejected",
        "repeat_of_rejected",
    )
    assert event.data["reason"] == "Order 1042 was already refunded"
    assert event.data["repeat_of"] == first
    assert not ApprovalVote.objects.exists()
    # The runtime reads the reason as a field, wherever it looks.
    assert detail(runtime, body["occurrence_id"])["rejection_reason"] == repeat.rejection_reason
    pickup = runtime.token(body["occurrence_id"])
    assert pickup.status_code == 409
    assert envelope(pickup)["details"]["reason"] == "Order 1042 was already refunded"


def test_a_contract_that_rejects_repeats_leaves_a_new_action_and_another_run_for_review(
    runtime: Runtime, reviewer: Any
) -> None:
    ToolContract.objects.filter(name="issue_refund").update(reject_repeats=True)
    reject(runtime.propose(client_ref="call_0").json()["occurrence_id"], reviewer, "no")

    other_action = runtime.propose(client_ref="x", arguments={**REFUND_ARGS, "amount_minor": 5})
    other_run = runtime.propose(client_ref="y", run_id="run-2")

    assert other_action.json()["status"] == "pending_review"
    assert other_run.json()["status"] == "pending_review"


def test_without_the_contract_option_a_repeat_still_goes_to_review(
    runtime: Runtime, reviewer: Any
) -> None:
    reject(runtime.propose(client_ref="call_0").json()["occurrence_id"], reviewer, "no")

    assert runtime.propose(client_ref="call_1").json()["status"] == "pending_review"
    assert not AuditEvent.objects.filter(reason_code="repeat_of_rejected").exists()


# --- renew ------------------------------------------------------------------------------------


def test_renew_sends_an_expired_approval_back_to_review_as_a_new_version(
    runtime: Runtime, approved: str
) -> None:
    old = Approval.objects.get()
    expire(approved)

    response = renew(runtime, approved)

    assert response.status_code == 200
    body = response.json()
    assert body == detail(runtime, approved)
    assert body["status"] == "pending_review"
    assert body["approval"] is None
    assert body["proposal"] == {
        "version": 2,
        "action_digest": REFUND_DIGEST,
        "canonical_action": REFUND_CANONICAL,
        "arguments": REFUND_ARGS,
        "edited_by": None,
    }
    old.refresh_from_db()
    assert old.state == Approval.State.EXPIRED
    assert old.superseded_at is not None
    assert old.proposal.version == 1
    renewed = AuditEvent.objects.get(kind="occurrence.renewed")
    assert renewed.actor == "runtime:agent"
    assert (renewed.data["from_version"], renewed.data["to_version"]) == (1, 2)
    # The expiry is written down, as the sweep would have done, before the renewal.
    expired = AuditEvent.objects.get(kind="approval.expired")
    assert expired.pk < renewed.pk


def test_renew_after_the_sweep(runtime: Runtime, approved: str) -> None:
    expire(approved)
    assert approvals_expire() == 1
    assert detail(runtime, approved)["status"] == "expired"

    response = renew(runtime, approved)

    assert response.status_code == 200
    assert response.json()["status"] == "pending_review"
    assert AuditEvent.objects.filter(kind="approval.expired").count() == 1


def test_a_renewed_occurrence_needs_a_fresh_review_and_then_works(
    runtime: Runtime, approved: str, reviewer: Any
) -> None:
    expire(approved)
    assert renew(runtime, approved).status_code == 200
    pending = runtime.token(approved)
    assert pending.status_code == 409
    assert envelope(pending)["code"] == "not_approved"

    assert approve(approved, reviewer).issued

    token = runtime.token(approved).json()["token"]
    claim = runtime.claim(token, "exec-a")
    assert claim.status_code == 200
    assert detail(runtime, approved)["approval"]["state"] == "consumed"
    assert Approval.objects.count() == 2


def test_the_old_approvals_votes_do_not_count_again(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = runtime.propose(arguments={**REFUND_ARGS, "amount_minor": 60000}).json()[
        "occurrence_id"
    ]
    approve(occurrence_id, reviewer)
    assert approve(occurrence_id, second_reviewer).issued
    expire(occurrence_id)
    assert renew(runtime, occurrence_id).status_code == 200

    outcome = approve(occurrence_id, reviewer)

    assert not outcome.issued
    assert (outcome.votes, outcome.needed) == (1, 2)
    assert approve(occurrence_id, second_reviewer).issued


def test_a_token_picked_up_before_expiry_cannot_claim_after_renewal(
    runtime: Runtime, approved: str, token: str, reviewer: Any
) -> None:
    expire(approved)
    assert renew(runtime, approved).status_code == 200
    assert approve(approved, reviewer).issued

    response = runtime.claim(token, "exec-a")

    assert response.status_code == 403
    assert response.json()["decision"] == "expired"
    assert not Command.objects.exists()


def test_renew_twice_is_refused_the_second_time(runtime: Runtime, approved: str) -> None:
    expire(approved)
    assert renew(runtime, approved).status_code == 200

    response = renew(runtime, approved)

    assert response.status_code == 409
    assert error_only(response)["code"] == "pending_review"
    assert Proposal.objects.count() == 2


def _pending(runtime: Runtime, reviewer: Any) -> str:
    occurrence_id: str = runtime.propose(client_ref="pending").json()["occurrence_id"]
    return occurrence_id


def _approved_in_time(runtime: Runtime, reviewer: Any) -> str:
    occurrence_id = _pending(runtime, reviewer)
    approve(occurrence_id, reviewer)
    return occurrence_id


def _claimed(runtime: Runtime, reviewer: Any) -> str:
    occurrence_id = _approved_in_time(runtime, reviewer)
    runtime.claim(runtime.token(occurrence_id).json()["token"], "exec-a")
    expire(occurrence_id)
    return occurrence_id


def _rejected(runtime: Runtime, reviewer: Any) -> str:
    occurrence_id = _pending(runtime, reviewer)
    reject(occurrence_id, reviewer, "Not this one")
    return occurrence_id


def _revoked(runtime: Runtime, reviewer: Any) -> str:
    occurrence_id = _approved_in_time(runtime, reviewer)
    approvals_revoke(
        approvals=Approval.objects.filter(occurrence_id=occurrence_id), actor="ada", reason="x"
    )
    expire(occurrence_id)
    return occurrence_id


def _auto_admitted(runtime: Runtime, reviewer: Any) -> str:
    occurrence_id: str = runtime.propose("lookup_order", {"order_id": "1042"}).json()[
        "occurrence_id"
    ]
    return occurrence_id


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (_pending, "pending_review"),
        (_approved_in_time, "not_expired"),
        (_claimed, "claimed"),
        (_rejected, "rejected"),
        (_revoked, "revoked"),
        (_auto_admitted, "auto_admitted"),
    ],
)
def test_renew_of_anything_but_an_expired_unclaimed_approval_is_409(
    runtime: Runtime, reviewer: Any, make: Any, code: str
) -> None:
    occurrence_id = make(runtime, reviewer)
    before = counts()
    status = Occurrence.objects.get(pk=occurrence_id).status

    response = renew(runtime, occurrence_id)

    assert response.status_code == 409
    error = error_only(response)
    assert error["code"] == code
    assert error["details"]["status"] == status
    if code == "rejected":
        assert error["details"]["reason"] == "Not this one"
    assert counts() == before
    assert Occurrence.objects.get(pk=occurrence_id).status == status


def test_renew_of_another_tenants_occurrence_is_404(
    runtime: Runtime, other_runtime: Runtime, approved: str
) -> None:
    expire(approved)

    response = renew(other_runtime, approved)

    assert response.status_code == 404
    assert error_only(response)["code"] == "not_found"
    assert Proposal.objects.count() == 1


# --- one error envelope -------------------------------------------------------------------


def _raw_post(runtime: Runtime, path: str, body: bytes, content_type: str) -> Any:
    return runtime.client.post(path, body, content_type=content_type)


@pytest.mark.parametrize(
    ("send", "status", "code"),
    [
        (lambda r: _raw_post(r, "/api/v1/occurrences", b"{", "application/json"), 400, None),
        (lambda r: _raw_post(r, "/api/v1/occurrences", b"", "application/json"), 400, None),
        (
            lambda r: _raw_post(r, "/api/v1/occurrences", b"\xff", "application/json"),
            400,
            "invalid_encoding",
        ),
        (
            lambda r: r.client.get("/api/v1/tools", HTTP_AUTHORIZATION="Bearer nope"),
            401,
            "unauthenticated",
        ),
        (lambda r: r.get(f"/api/v1/occurrences/{uuid.uuid4()}"), 404, "not_found"),
        (lambda r: r.get("/api/v1/no-such-endpoint"), 404, "not_found"),
        (lambda r: r.get("/api/v1/tools/no_such_tool"), 404, "not_found"),
        (lambda r: r.client.delete("/api/v1/occurrences"), 405, "method_not_allowed"),
        (lambda r: r.client.put("/api/v1/tools"), 405, "method_not_allowed"),
        (lambda r: r.token(r.propose().json()["occurrence_id"]), 409, "not_approved"),
        (
            lambda r: _raw_post(
                r,
                "/api/v1/occurrences",
                json.dumps({"reason": "x" * 70_000}).encode(),
                "application/json",
            ),
            413,
            "payload_too_large",
        ),
        (
            lambda r: _raw_post(r, "/api/v1/occurrences", b"{}", "text/plain"),
            415,
            "unsupported_media_type",
        ),
        (lambda r: r.post("/api/v1/occurrences", {"tool": "issue_refund"}), 422, "missing_field"),
        (lambda r: r.propose(arguments={**REFUND_ARGS, "amount_minor": 1.5}), 422, None),
        (lambda r: r.post("/api/v1/claims", {"token": "x"}), 422, "missing_field"),
        (lambda r: r.get("/api/v1/audit/events?after=-1"), 422, "out_of_range"),
        (
            lambda r: r.post("/api/v1/actions/canonicalize", {"tool": "nope", "arguments": {}}),
            422,
            "unknown_tool",
        ),
    ],
)
def test_every_4xx_carries_code_message_and_details(
    runtime: Runtime, send: Any, status: int, code: str | None
) -> None:
    response = send(runtime)

    assert response.status_code == status, response.content
    error = error_only(response)
    if code is not None:
        assert error["code"] == code


def test_a_field_error_names_its_fields_in_details_and_a_plain_one_has_null_details(
    runtime: Runtime,
) -> None:
    refused = runtime.propose(arguments={**REFUND_ARGS, "amount_minor": 1.5})
    unknown = runtime.get(f"/api/v1/occurrences/{uuid.uuid4()}")

    assert envelope(refused)["details"][0]["field"] == "arguments.amount_minor"
    assert envelope(unknown)["details"] is None


def test_not_approved_carries_retry_after(runtime: Runtime) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]

    response = runtime.token(occurrence_id)

    assert response.status_code == 409
    assert envelope(response)["code"] == "not_approved"
    assert response["Retry-After"] == "5"


def test_a_final_refusal_carries_no_retry_after(runtime: Runtime, approved: str) -> None:
    runtime.token(approved)

    response = runtime.token(approved)

    assert envelope(response)["code"] == "token_already_delivered"
    assert not response.has_header("Retry-After")


def test_the_pickups_rejected_carries_the_reason_as_a_field(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]
    reject(occurrence_id, reviewer, "Order 1042 was already refunded")

    response = runtime.token(occurrence_id)

    assert response.status_code == 409
    error = error_only(response)
    assert error["code"] == "rejected"
    assert error["details"]["reason"] == "Order 1042 was already refunded"
    assert error["details"]["rejected_at"]
    assert detail(runtime, occurrence_id)["rejection_reason"] == "Order 1042 was already refunded"


def test_a_claim_refusal_keeps_decision_and_reason_beside_the_envelope(
    runtime: Runtime, token: str
) -> None:
    runtime.claim(token, "exec-a")

    response = runtime.claim(token, "exec-b")

    assert response.status_code == 403
    body = response.json()
    assert set(body) == {"decision", "reason", "error"}
    assert (body["decision"], body["reason"]) == ("replayed", "consumed_by_other_execution")
    error = envelope(response)
    assert error["code"] == "replayed"
    assert error["details"] == {"reason": "consumed_by_other_execution"}


def test_an_unknown_token_claim_refusal_has_the_envelope_too(runtime: Runtime) -> None:
    response = runtime.claim("apv_" + "x" * 43, "exec-a")

    assert response.status_code == 403
    assert response.json()["decision"] == "unknown_token"
    assert envelope(response)["code"] == "unknown_token"


# --- tool contracts -------------------------------------------------------------------------


def test_tools_lists_every_contract_with_what_a_runtime_needs(runtime: Runtime) -> None:
    response = runtime.get("/api/v1/tools")

    assert response.status_code == 200
    tools = response.json()["tools"]
    assert [t["name"] for t in tools] == sorted(ToolContract.objects.values_list("name", flat=True))
    refund = next(t for t in tools if t["name"] == "issue_refund")
    contract = ToolContract.objects.get(name="issue_refund")
    assert refund["arguments_schema"] == contract.json_schema
    assert refund["replay_safety"] == "effect_queryable"
    assert refund["executed_by"] == "console"
    assert refund["auto_admit"] is False
    assert refund["approval_lifetime_seconds"] == 15 * 60
    assert refund["reject_repeats"] is False
    assert refund["approvals_needed"] == {
        "rule": quorum_rule(contract),
        "approvals_required": 2,
        "quorum_amount_argument": "amount_minor",
        "quorum_currency_argument": contract.quorum_currency_argument or None,
        "quorum_thresholds_minor": contract.quorum_thresholds_minor or {},
        "quorum_threshold_minor": contract.quorum_threshold_minor,
    }
    assert refund["approvals_needed"]["rule"].startswith("2 distinct reviewers when amount_minor")
    close_case = next(t for t in tools if t["name"] == "close_case")
    assert close_case["executed_by"] == "runtime"
    assert close_case["approvals_needed"] == {
        "rule": "1 reviewer",
        "approvals_required": 1,
        "quorum_amount_argument": None,
        "quorum_currency_argument": None,
        "quorum_thresholds_minor": {},
        "quorum_threshold_minor": None,
    }


def test_one_tool_is_the_same_as_in_the_list(runtime: Runtime) -> None:
    listed = next(
        t for t in runtime.get("/api/v1/tools").json()["tools"] if t["name"] == "lookup_order"
    )

    response = runtime.get("/api/v1/tools/lookup_order")

    assert response.status_code == 200
    assert response.json() == listed
    assert listed["replay_safety"] == "read_only"
    assert listed["auto_admit"] is True


def test_tools_need_a_runtime_key(client: Any) -> None:
    for path in ("/api/v1/tools", "/api/v1/tools/issue_refund"):
        response = client.get(path)
        assert response.status_code == 401
        assert error_only(response)["code"] == "unauthenticated"


def test_canonicalize_returns_what_a_proposal_would_digest_and_writes_nothing(
    runtime: Runtime,
) -> None:
    before = counts()
    shuffled = dict(reversed(list(REFUND_ARGS.items())))

    response = runtime.post(
        "/api/v1/actions/canonicalize", {"tool": "issue_refund", "arguments": shuffled}
    )

    assert response.status_code == 200
    assert response.json() == {
        "tool": "issue_refund",
        "arguments": REFUND_ARGS,
        "canonical_action": REFUND_CANONICAL,
        "action_digest": REFUND_DIGEST,
        "approvals_needed": 1,
        "prior_decisions": [],
    }
    assert counts() == before
    assert runtime.propose().json()["proposal"]["action_digest"] == REFUND_DIGEST


def test_canonicalize_with_a_run_tells_of_its_rejections_without_proposing(
    runtime: Runtime, reviewer: Any
) -> None:
    """A runtime that lost a rejection from its history asks before proposing again."""
    rejected = runtime.propose(run_id="run-9").json()["occurrence_id"]
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=rejected), reviewer=reviewer, reason="Not again"
    )
    before = counts()

    same_run = runtime.post(
        "/api/v1/actions/canonicalize",
        {"tool": "issue_refund", "arguments": REFUND_ARGS, "run_id": "run-9"},
    ).json()
    other_run = runtime.post(
        "/api/v1/actions/canonicalize",
        {"tool": "issue_refund", "arguments": REFUND_ARGS, "run_id": "run-10"},
    ).json()

    assert [
        (p["occurrence_id"], p["reason"], p["decided_by"]) for p in same_run["prior_decisions"]
    ] == [(rejected, "Not again", "rita")]
    assert other_run["prior_decisions"] == []
    assert counts() == before


def test_canonicalize_says_how_many_approvers_a_large_refund_needs(runtime: Runtime) -> None:
    body = runtime.post(
        "/api/v1/actions/canonicalize",
        {"tool": "issue_refund", "arguments": {**REFUND_ARGS, "amount_minor": 60000}},
    ).json()

    assert body["approvals_needed"] == 2


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("no_such_tool", REFUND_ARGS),
        ("issue_refund", {**REFUND_ARGS, "amount_minor": 8000.0}),
        ("issue_refund", {**REFUND_ARGS, "extra": 1}),
        ("issue_refund", {k: v for k, v in REFUND_ARGS.items() if k != "currency"}),
        ("issue_refund", {**REFUND_ARGS, "amount_minor": 2**53}),
    ],
)
def test_canonicalize_refuses_what_a_proposal_would_refuse_with_the_same_422(
    runtime: Runtime, tool: str, arguments: dict[str, Any]
) -> None:
    before = counts()

    refused = runtime.post("/api/v1/actions/canonicalize", {"tool": tool, "arguments": arguments})
    proposed = runtime.propose(tool, arguments)

    assert refused.status_code == proposed.status_code == 422
    assert refused.json() == proposed.json()
    envelope(refused)
    assert counts() == before


# --- the schema ---------------------------------------------------------------------------


def test_the_openapi_schema_lists_the_new_operations_with_their_responses(client: Any) -> None:
    paths = client.get("/api/v1/openapi.json").json()["paths"]

    def statuses(path: str, method: str) -> set[str]:
        return set(paths[path][method]["responses"])

    assert {"200", "401", "404", "422"} <= statuses("/api/v1/occurrences", "get")
    assert {"200", "201", "409", "422"} <= statuses("/api/v1/occurrences", "post")
    assert {"200", "401", "404", "409"} <= statuses(
        "/api/v1/occurrences/{occurrence_id}/renew", "post"
    )
    assert {"200", "401"} <= statuses("/api/v1/tools", "get")
    assert {"200", "401", "404"} <= statuses("/api/v1/tools/{name}", "get")
    assert {"200", "400", "401", "413", "415", "422"} <= statuses(
        "/api/v1/actions/canonicalize", "post"
    )
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert {"arguments", "edited_by"} <= set(schemas["ProposalOut"]["properties"])
    assert "prior_decisions" in schemas["ProposeOut"]["properties"]
    assert "command" in schemas["OccurrenceOut"]["properties"]
    assert {"decision", "reason", "error"} <= set(schemas["ClaimRefusedOut"]["properties"])
    assert "details" in schemas["ErrorBody"]["required"]


def test_a_poller_gets_304_until_the_occurrence_changes(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]
    first = runtime.get(f"/api/v1/occurrences/{occurrence_id}")
    etag = first["ETag"]
    assert first.status_code == 200 and etag.startswith('"')

    unchanged = runtime.get(f"/api/v1/occurrences/{occurrence_id}", HTTP_IF_NONE_MATCH=etag)
    assert unchanged.status_code == 304 and unchanged.content == b""
    assert unchanged["ETag"] == etag
    other = runtime.get(f"/api/v1/occurrences/{occurrence_id}", HTTP_IF_NONE_MATCH='"nope"')
    assert other.status_code == 200

    approve(occurrence_id, reviewer)
    changed = runtime.get(f"/api/v1/occurrences/{occurrence_id}", HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200
    assert changed.json()["status"] == "approved" and changed["ETag"] != etag
