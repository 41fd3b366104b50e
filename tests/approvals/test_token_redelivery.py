"""Issue 8, item 1: a lost token no longer strands the approval.

A runtime that picks up the token with an ``execution_id`` binds the approval to that
execution. After a crash that lost the token, the same execution asks again and gets a
fresh one (the old one is void); another execution, and any claim but the bound
execution's, is refused. Without an ``execution_id``, the single delivery of API v1 holds.
"""

from __future__ import annotations

from typing import Any

from approvals.models import Approval, AuditEvent, Command, RetiredToken
from approvals.reviews.revocation import approval_revoke
from tests.conftest import Runtime, make_runtime

EXECUTION = "thread-7:call_0:attempt-1"


def pickup(runtime: Runtime, occurrence_id: str, execution_id: str | None = None) -> Any:
    body = None if execution_id is None else {"execution_id": execution_id}
    return runtime.post(f"/api/v1/occurrences/{occurrence_id}/token", body)


def test_the_first_pickup_binds_the_approval_to_the_execution(
    runtime: Runtime, approved: str
) -> None:
    picked = pickup(runtime, approved, EXECUTION)

    assert picked.status_code == 200, picked.content
    body = picked.json()
    assert body["token"].startswith("apv_")
    assert body["execution_id"] == EXECUTION
    assert body["redelivered"] is False
    approval = Approval.objects.get(occurrence_id=approved)
    assert approval.bound_execution_id == EXECUTION
    event = AuditEvent.objects.get(kind="token.delivered")
    assert event.execution_id == EXECUTION and event.token_fingerprint == body["fingerprint"]


def test_the_same_execution_gets_a_fresh_token_and_the_lost_one_is_void(
    runtime: Runtime, approved: str
) -> None:
    lost = pickup(runtime, approved, EXECUTION).json()

    again = pickup(runtime, approved, EXECUTION)

    assert again.status_code == 200, again.content
    fresh = again.json()
    assert fresh["redelivered"] is True
    assert fresh["token"] != lost["token"] and fresh["fingerprint"] != lost["fingerprint"]
    # Only the hash changed; the history of fingerprints is kept.
    approval = Approval.objects.get(occurrence_id=approved)
    assert approval.fingerprint == fresh["fingerprint"]
    assert list(RetiredToken.objects.values_list("fingerprint", flat=True)) == [lost["fingerprint"]]
    event = AuditEvent.objects.get(kind="token.redelivered")
    assert event.execution_id == EXECUTION
    assert event.token_fingerprint == fresh["fingerprint"]
    assert event.data == {"retired_fingerprint": lost["fingerprint"]}
    assert lost["token"] not in str(event.data) and fresh["token"] not in str(event.data)

    # The lost token, should it turn up, is a named replay; the fresh one claims.
    replay = runtime.claim(lost["token"], EXECUTION)
    assert replay.status_code == 403
    assert (replay.json()["decision"], replay.json()["reason"]) == ("replayed", "token_redelivered")
    refused = AuditEvent.objects.get(kind="claim.replayed")
    assert refused.token_fingerprint == lost["fingerprint"]
    assert str(refused.occurrence_id) == approved
    claimed = runtime.claim(fresh["token"], EXECUTION)
    assert claimed.status_code == 200 and claimed.json()["decision"] == "approved"
    assert Command.objects.filter(occurrence_id=approved).count() == 1


def test_another_execution_cannot_have_the_token_nor_claim_it(
    runtime: Runtime, approved: str
) -> None:
    token = pickup(runtime, approved, EXECUTION).json()["token"]

    other = pickup(runtime, approved, "another-execution")
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "token_already_delivered"
    assert "another-execution" not in other.content.decode()

    stolen = runtime.claim(token, "another-execution")
    assert stolen.status_code == 403
    assert (stolen.json()["decision"], stolen.json()["reason"]) == (
        "replayed",
        "bound_to_other_execution",
    )
    approval = Approval.objects.get(occurrence_id=approved)
    assert approval.state == Approval.State.ISSUED  # the refusal consumed nothing
    assert not Command.objects.exists()
    assert runtime.claim(token, EXECUTION).json()["decision"] == "approved"


def test_after_the_claim_the_execution_is_told_its_command(runtime: Runtime, approved: str) -> None:
    token = pickup(runtime, approved, EXECUTION).json()["token"]
    command_id = runtime.claim(token, EXECUTION).json()["command_id"]

    after = pickup(runtime, approved, EXECUTION)

    assert after.status_code == 409
    error = after.json()["error"]
    assert error["code"] == "claimed"
    assert error["details"] == {"command_id": command_id, "execution_id": EXECUTION}
    assert "token" not in after.json()
    assert not RetiredToken.objects.exists()
    # The same token presented again is the queue's redelivery, as before.
    assert runtime.claim(token, EXECUTION).json()["decision"] == "duplicate_delivery"


def test_without_an_execution_id_the_single_delivery_of_v1_holds(
    runtime: Runtime, approved: str
) -> None:
    first = pickup(runtime, approved)
    assert first.status_code == 200
    assert first.json()["execution_id"] is None and first.json()["redelivered"] is False
    for execution_id in (None, EXECUTION):
        again = pickup(runtime, approved, execution_id)
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "token_already_delivered"
    # Unbound: any execution of the proposing key may claim, as before.
    claimed = runtime.claim(first.json()["token"], "any-execution")
    assert claimed.json()["decision"] == "approved"


def test_an_empty_object_is_a_pickup_without_execution(runtime: Runtime, approved: str) -> None:
    picked = runtime.post(f"/api/v1/occurrences/{approved}/token", {})

    assert picked.status_code == 200
    assert Approval.objects.get(occurrence_id=approved).bound_execution_id == ""


def test_a_bad_body_is_refused_and_binds_nothing(runtime: Runtime, approved: str) -> None:
    for body, code in (
        ({"execution_id": ""}, "too_short"),
        ({"execution_id": 7}, "wrong_type"),
        ({"execution_id": "x" * 201}, "too_long"),
        ({"execution": "typo"}, "unknown_field"),
    ):
        refused = runtime.post(f"/api/v1/occurrences/{approved}/token", body)
        assert refused.status_code == 422, (body, refused.content)
        assert refused.json()["error"]["code"] == code, (body, refused.json())
    approval = Approval.objects.get(occurrence_id=approved)
    assert approval.token_hash is None and approval.bound_execution_id == ""
    assert not AuditEvent.objects.filter(kind__startswith="token.").exists()


def test_a_revoked_approval_is_not_redelivered(
    runtime: Runtime, approved: str, admin_user: Any
) -> None:

    pickup(runtime, approved, EXECUTION)
    approval_revoke(
        approval=Approval.objects.get(occurrence_id=approved), admin=admin_user, reason="stop"
    )

    again = pickup(runtime, approved, EXECUTION)

    assert again.status_code == 409
    assert again.json()["error"]["code"] == "revoked"
    assert not RetiredToken.objects.exists()


def test_another_key_still_cannot_redeliver(runtime: Runtime, approved: str) -> None:
    pickup(runtime, approved, EXECUTION)
    sibling = make_runtime(Approval.objects.get(occurrence_id=approved).tenant, "sibling")

    refused = pickup(sibling, approved, EXECUTION)

    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "other_runtime_key"
    assert not RetiredToken.objects.exists()


def test_the_review_page_tells_a_redelivery_from_a_replay(
    runtime: Runtime, approved: str, reviewer: Any
) -> None:
    from django.test import Client

    lost = pickup(runtime, approved, EXECUTION).json()
    fresh = pickup(runtime, approved, EXECUTION).json()
    runtime.claim(lost["token"], EXECUTION)
    client = Client()
    client.force_login(reviewer)

    page = client.get(f"/reviews/{approved}/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "Re-delivery · same execution" in html
    assert lost["fingerprint"] in html and fresh["fingerprint"] in html
    assert lost["token"] not in html and fresh["token"] not in html
    assert html.count("Replay refused") >= 1  # the lost token's claim
    assert "token_redelivered" in html
