"""Every way a claim can be refused, each with its exact decision and reason.

A refused claim must leave the approval exactly as it was (still issued, still claimable
with the right action where that makes sense) and write one audit event that names the
token by its fingerprint only.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from approvals.access import tokens
from approvals.claims.claim import approval_claim
from approvals.models import Approval, AuditEvent, Command, Occurrence
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from approvals.reviews.revocation import approval_revoke
from tests.conftest import REFUND_ARGS, Runtime, approve

MADE_UP_TOKEN = "apv_" + "A" * 43

# Only on PostgreSQL is DbNow() the transaction's start, an instant a test can read first.
transaction_clock = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL's CURRENT_TIMESTAMP"
)


def _approval(occurrence_id: str) -> Approval:
    return Approval.objects.get(occurrence_id=occurrence_id, proposal__is_current=True)


def _snapshot(approval_pk: int) -> dict[str, Any]:
    return dict(Approval.objects.filter(pk=approval_pk).values().get())


def _transaction_now() -> datetime:
    # The whole test runs in one transaction, so this is the instant DbNow() compares with.
    with connection.cursor() as cursor:
        cursor.execute("SELECT CURRENT_TIMESTAMP")
        value: datetime = cursor.fetchone()[0]
    return value


def _claim_event(before: int) -> AuditEvent:
    (event,) = AuditEvent.objects.filter(pk__gt=before, kind__startswith="claim.")
    assert AuditEvent.objects.filter(pk__gt=before).count() == 1
    return event


def _last_event_id() -> int:
    last = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
    return last or 0


def _assert_no_raw_token(raw: str) -> None:
    for row in AuditEvent.objects.values():
        assert raw not in repr(row)


def claim_expecting(
    runtime: Runtime,
    token: str,
    execution_id: str,
    decision: str,
    reason: str | None = None,
    **action: Any,
) -> dict[str, Any]:
    """Claim through the API; check the decision, the reason and the one audit event."""
    before = _last_event_id()
    response = runtime.claim(token, execution_id, **action)
    body: dict[str, Any] = response.json()
    admitted = decision in {"approved", "duplicate_delivery"}
    assert response.status_code == (200 if admitted else 403), body
    assert body["decision"] == decision, body
    if admitted:
        assert set(body) == {"decision", "command_id", "idempotency_key", "executed_by"}
    else:
        assert {k: body[k] for k in ("decision", "reason")} == {
            "decision": decision,
            "reason": reason,
        }
        assert body["error"]["code"] == decision
        assert body["error"]["details"] == {"reason": reason}

    event = _claim_event(before)
    assert event.kind == f"claim.{decision}"
    assert event.decision == decision
    assert event.token_fingerprint == tokens.fingerprint(token)
    assert event.execution_id == execution_id
    assert event.tenant_id == runtime.key.tenant_id
    if reason is not None:
        assert event.reason_code == reason
    assert event.command_id == (uuid.UUID(body["command_id"]) if admitted else None)
    _assert_no_raw_token(token)
    return body


# --- scope: the action must be exactly the approved one -------------------------------


ARGS_WITHOUT_REASON = {k: v for k, v in REFUND_ARGS.items() if k != "reason"}
MESSAGE_ARGS = {"to": "ana@example.com", "subject": "Your refund", "body": "It is on its way."}
FLOAT_AMOUNT_ARGS = {**REFUND_ARGS, "amount_minor": 8000.0}


@pytest.mark.parametrize(
    ("tool", "arguments", "reason"),
    [
        pytest.param(
            "issue_refund",
            {**REFUND_ARGS, "payment_id": "pay_999"},
            "action_differs",
            id="payment_id",
        ),
        pytest.param(
            "issue_refund", {**REFUND_ARGS, "amount_minor": 8001}, "action_differs", id="amount"
        ),
        pytest.param(
            "issue_refund", {**REFUND_ARGS, "currency": "USD"}, "action_differs", id="currency"
        ),
        pytest.param("send_message", MESSAGE_ARGS, "tool_differs", id="tool"),
        # Actions that break their tool's contract can match no approval at all.
        pytest.param("send_message", REFUND_ARGS, "action_invalid", id="tool-with-its-arguments"),
        pytest.param("wire_money", REFUND_ARGS, "action_invalid", id="unknown-tool"),
        pytest.param(
            "issue_refund", {**REFUND_ARGS, "note": "x"}, "action_invalid", id="added-argument"
        ),
        pytest.param("issue_refund", ARGS_WITHOUT_REASON, "action_invalid", id="missing-argument"),
        pytest.param(
            "issue_refund",
            {**REFUND_ARGS, "amount_minor": "8000"},
            "action_invalid",
            id="amount-as-string",
        ),
        # RFC 8785 writes 8000.0 as 8000, so only the contract tells it from the approved
        # integer: money is integer minor units, and a float is refused, never rounded.
        pytest.param(
            "issue_refund",
            {**REFUND_ARGS, "amount_minor": 8000.0},
            "action_invalid",
            id="amount-as-integral-float",
        ),
        pytest.param(
            "issue_refund",
            {**REFUND_ARGS, "amount_minor": True},
            "action_invalid",
            id="amount-as-boolean",
        ),
    ],
)
def test_changed_action_is_scope_mismatch_and_leaves_the_token_claimable(
    runtime: Runtime, approved: str, token: str, tool: str, arguments: Any, reason: str
) -> None:
    approval = _approval(approved)
    before = _snapshot(approval.pk)

    claim_expecting(
        runtime, token, "exec-a", "scope_mismatch", reason, tool=tool, arguments=arguments
    )

    assert _snapshot(approval.pk) == before
    assert before["state"] == Approval.State.ISSUED
    assert not Command.objects.exists()
    claim_expecting(runtime, token, "exec-a", "approved", "claimed")


def test_token_of_another_tenant_is_unknown_there(
    runtime: Runtime, other_runtime: Runtime, approved: str, token: str
) -> None:
    approval = _approval(approved)
    before = _snapshot(approval.pk)

    claim_expecting(other_runtime, token, "exec-a", "unknown_token", "no_such_token")

    assert _snapshot(approval.pk) == before
    event = AuditEvent.objects.get(kind="claim.unknown_token")
    # The refusal is the other tenant's evidence; it names no occurrence of this tenant.
    assert event.occurrence_id is None
    claim_expecting(runtime, token, "exec-a", "approved", "claimed")


def test_made_up_token_is_unknown(runtime: Runtime, approved: str, token: str) -> None:
    approval = _approval(approved)
    before = _snapshot(approval.pk)

    claim_expecting(runtime, MADE_UP_TOKEN, "exec-a", "unknown_token", "no_such_token")

    assert _snapshot(approval.pk) == before
    claim_expecting(runtime, token, "exec-a", "approved", "claimed")


# --- time -------------------------------------------------------------------------------


def _expire_at(approval: Approval, expires_at: datetime) -> None:
    Approval.objects.filter(pk=approval.pk).update(
        issued_at=expires_at - timedelta(minutes=15), expires_at=expires_at
    )


@transaction_clock
def test_claim_at_exactly_expires_at_is_expired(
    runtime: Runtime, approved: str, token: str
) -> None:
    approval = _approval(approved)
    _expire_at(approval, _transaction_now())
    before = _snapshot(approval.pk)

    claim_expecting(runtime, token, "exec-a", "expired", "expired")

    assert _snapshot(approval.pk) == before
    # Nothing returns to issued: a later claim is refused the same way.
    claim_expecting(runtime, token, "exec-a", "expired", "expired")
    assert not Command.objects.exists()


@transaction_clock
def test_claim_one_microsecond_before_expires_at_is_approved(
    runtime: Runtime, approved: str, token: str
) -> None:
    approval = _approval(approved)
    _expire_at(approval, _transaction_now() + timedelta(microseconds=1))

    claim_expecting(runtime, token, "exec-a", "approved", "claimed")

    assert _approval(approved).state == Approval.State.CONSUMED


@transaction_clock
def test_expired_wins_over_a_changed_action(runtime: Runtime, approved: str, token: str) -> None:
    approval = _approval(approved)
    _expire_at(approval, _transaction_now())

    claim_expecting(
        runtime, token, "exec-a", "expired", "expired", arguments={**REFUND_ARGS, "amount_minor": 1}
    )


@transaction_clock
def test_expired_wins_over_an_invalid_action(runtime: Runtime, approved: str, token: str) -> None:
    approval = _approval(approved)
    _expire_at(approval, _transaction_now())

    claim_expecting(runtime, token, "exec-a", "expired", "expired", arguments=FLOAT_AMOUNT_ARGS)


# --- revocation and rejection -----------------------------------------------------------


def test_revoked_approval_is_refused(
    runtime: Runtime, approved: str, token: str, admin_user: Any
) -> None:
    approval = _approval(approved)
    assert approval_revoke(approval=approval, admin=admin_user, reason="Fraud suspected")
    before = _snapshot(approval.pk)

    claim_expecting(runtime, token, "exec-a", "revoked", "revoked_by_admin")

    assert _snapshot(approval.pk) == before
    assert before["state"] == Approval.State.REVOKED
    assert not Command.objects.exists()


def test_rejected_occurrence_has_no_token(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason="Too much"
    )

    response = runtime.token(occurrence_id)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "rejected"
    assert not Approval.objects.exists()
    claim_expecting(runtime, MADE_UP_TOKEN, "exec-a", "unknown_token", "no_such_token")


# --- versions ---------------------------------------------------------------------------

EDITED_ARGS = {**REFUND_ARGS, "amount_minor": 5000}


def _edit(occurrence_id: str, editor: Any) -> None:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    proposal_edit(
        occurrence=occurrence,
        editor=editor,
        arguments=EDITED_ARGS,
        seen_digest=occurrence.proposals.get(is_current=True).action_digest,
    )


def test_token_of_a_superseded_version_authorizes_neither_version(
    runtime: Runtime, approved: str, token: str, reviewer: Any, second_reviewer: Any
) -> None:
    old = _approval(approved)
    _edit(approved, reviewer)
    before = _snapshot(old.pk)
    assert before["superseded_at"] is not None

    claim_expecting(runtime, token, "exec-a", "scope_mismatch", "proposal_superseded")
    claim_expecting(
        runtime, token, "exec-a", "scope_mismatch", "proposal_superseded", arguments=EDITED_ARGS
    )

    assert _snapshot(old.pk) == before
    assert before["state"] == Approval.State.ISSUED
    # The new version needs its own approval and its own token.
    assert approve(approved, second_reviewer).issued
    new_token = runtime.token(approved).json()["token"]
    claim_expecting(runtime, new_token, "exec-a", "scope_mismatch", "action_differs")
    claim_expecting(runtime, new_token, "exec-a", "approved", "claimed", arguments=EDITED_ARGS)
    claim_expecting(runtime, token, "exec-b", "scope_mismatch", "proposal_superseded")


# --- the second claim -------------------------------------------------------------------


def test_same_execution_again_is_duplicate_delivery_of_the_same_command(
    runtime: Runtime, approved: str, token: str
) -> None:
    first = claim_expecting(runtime, token, "exec-a", "approved", "claimed")
    again = claim_expecting(
        runtime, token, "exec-a", "duplicate_delivery", "same_execution_redelivery"
    )

    assert again == {**first, "decision": "duplicate_delivery"}
    assert Command.objects.count() == 1


def test_other_execution_is_replayed(runtime: Runtime, approved: str, token: str) -> None:
    claim_expecting(runtime, token, "exec-a", "approved", "claimed")
    approval = _approval(approved)
    before = _snapshot(approval.pk)

    claim_expecting(runtime, token, "exec-b", "replayed", "consumed_by_other_execution")

    assert _snapshot(approval.pk) == before
    assert before["consumed_by_execution"] == "exec-a"
    assert Command.objects.count() == 1


def test_same_execution_with_another_action_is_scope_mismatch(
    runtime: Runtime, approved: str, token: str
) -> None:
    claim_expecting(runtime, token, "exec-a", "approved", "claimed")

    claim_expecting(
        runtime,
        token,
        "exec-a",
        "scope_mismatch",
        "action_differs",
        arguments={**REFUND_ARGS, "amount_minor": 1},
    )
    assert Command.objects.count() == 1


def test_invalid_action_after_the_claim_is_neither_a_redelivery_nor_a_new_claim(
    runtime: Runtime, approved: str, token: str
) -> None:
    claim_expecting(runtime, token, "exec-a", "approved", "claimed")

    # The same execution with a float amount is not handed the command...
    claim_expecting(
        runtime, token, "exec-a", "scope_mismatch", "action_invalid", arguments=FLOAT_AMOUNT_ARGS
    )
    # ...and another execution is told what matters most: the token is spent.
    claim_expecting(
        runtime,
        token,
        "exec-b",
        "replayed",
        "consumed_by_other_execution",
        arguments=FLOAT_AMOUNT_ARGS,
    )
    assert Command.objects.count() == 1


def test_service_refuses_a_float_amount_that_canonicalizes_to_the_approved_one(
    runtime: Runtime, approved: str, token: str
) -> None:
    # The service itself refuses, whatever parsed the body.
    result = approval_claim(
        tenant=runtime.key.tenant,
        token=token,
        tool="issue_refund",
        arguments=FLOAT_AMOUNT_ARGS,
        execution_id="exec-a",
    )

    assert (result.decision, result.reason, result.command) == (
        "scope_mismatch",
        "action_invalid",
        None,
    )
    assert _approval(approved).state == Approval.State.ISSUED


def _columns(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_admitted_claim_hands_back_the_command_exactly_as_stored(
    runtime: Runtime, approved: str, token: str
) -> None:
    result = approval_claim(
        tenant=runtime.key.tenant,
        token=token,
        tool="issue_refund",
        arguments=dict(REFUND_ARGS),
        execution_id="exec-a",
        message_id="msg-a",
    )

    assert result.command is not None
    command = Command.objects.get()
    assert _columns(result.command) == _columns(command)
    assert command.idempotency_key == f"cmd_{command.id.hex}"
    assert (command.epoch.number, command.epoch.execution_id) == (1, "exec-a")
    assert Occurrence.objects.get(pk=approved).status == Occurrence.Status.CLAIMED
    event = AuditEvent.objects.get(kind="claim.approved")
    assert (event.command_id, event.message_id, event.data) == (
        command.id,
        "msg-a",
        {"epoch": 1, "idempotency_key": command.idempotency_key, "executed_by": "console"},
    )


def test_raw_token_is_not_logged(
    runtime: Runtime, approved: str, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="approvals")

    runtime.claim(token, "exec-a")
    runtime.claim(token, "exec-b")
    runtime.claim(token, "exec-a", arguments={**REFUND_ARGS, "amount_minor": 1})

    assert tokens.fingerprint(token) in caplog.text
    assert token not in caplog.text
