"""Deadlines of a pending request: escalated past the contract's review deadline, ended
``timed_out`` past its final deadline (fail-closed), by the sweep on the database's clock;
a contract without deadlines behaves as before."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals import metrics
from approvals.errors import ErrorCode, ServiceError
from approvals.models import Approval, AuditEvent, CallbackDelivery, Occurrence, ToolContract
from approvals.reviews.deadlines import review_deadlines_apply
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from approvals.reviews.renewal import occurrence_renew
from approvals.tasks import review_deadlines_sweep
from tests.conftest import Runtime, approve

pytestmark = pytest.mark.django_db


@pytest.fixture
def deadlines() -> ToolContract:
    contract = ToolContract.objects.get(name="issue_refund")
    contract.review_deadline = timedelta(minutes=30)
    contract.final_deadline = timedelta(hours=2)
    contract.save()
    return contract


def proposed(runtime: Runtime, ref: str = "r1") -> str:
    response = runtime.propose(client_ref=ref)
    assert response.status_code == 201, response.content
    occurrence_id: str = response.json()["occurrence_id"]
    return occurrence_id


def pass_review_deadline(occurrence_id: str) -> None:
    # PostgreSQL's now() is the test transaction's start, before the fixtures ran.
    Occurrence.objects.filter(pk=occurrence_id).update(
        review_deadline_at=timezone.now() - timedelta(minutes=5)
    )


def pass_final_deadline(occurrence_id: str) -> None:
    past = timezone.now() - timedelta(minutes=5)
    Occurrence.objects.filter(pk=occurrence_id).update(
        review_deadline_at=past - timedelta(minutes=30), final_deadline_at=past
    )


def sample(name: str, event: str) -> float:
    value = metrics.REGISTRY.get_sample_value(f"{name}_total", {"event": event})
    return value or 0.0


# --- the contract ---------------------------------------------------------------------------


def test_a_final_deadline_must_come_after_the_review_deadline() -> None:
    contract = ToolContract.objects.get(name="issue_refund")
    contract.review_deadline = timedelta(minutes=30)
    contract.final_deadline = timedelta(minutes=30)
    with pytest.raises(ValidationError) as raised:
        contract.full_clean()
    assert "final_deadline" in raised.value.message_dict
    contract.final_deadline = timedelta(minutes=-1)
    contract.review_deadline = None
    with pytest.raises(ValidationError):
        contract.full_clean()
    contract.review_deadline, contract.final_deadline = timedelta(minutes=5), timedelta(hours=1)
    contract.full_clean()


def test_the_database_refuses_a_final_deadline_before_the_review_deadline() -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        ToolContract.objects.filter(name="issue_refund").update(
            review_deadline=timedelta(hours=1), final_deadline=timedelta(minutes=10)
        )


def test_the_tools_api_lists_the_deadlines(runtime: Runtime, deadlines: ToolContract) -> None:
    tools = {t["name"]: t for t in runtime.get("/api/v1/tools").json()["tools"]}
    assert tools["issue_refund"]["review_deadline_seconds"] == 1800
    assert tools["issue_refund"]["final_deadline_seconds"] == 7200
    assert tools["send_message"]["review_deadline_seconds"] is None
    assert tools["send_message"]["final_deadline_seconds"] is None


# --- without deadlines: as before -------------------------------------------------------------


def test_a_contract_without_deadlines_waits_as_before(runtime: Runtime) -> None:
    occurrence_id = proposed(runtime)
    Occurrence.objects.filter(pk=occurrence_id).update(
        created_at=timezone.now() - timedelta(days=30)
    )
    assert review_deadlines_apply() == (0, 0)
    body = runtime.get(f"/api/v1/occurrences/{occurrence_id}").json()
    assert body["status"] == "pending_review"
    assert (body["review_deadline_at"], body["final_deadline_at"], body["escalated_at"]) == (
        None,
        None,
        None,
    )


# --- escalation -------------------------------------------------------------------------------


def test_past_the_review_deadline_a_request_is_escalated_once_and_stays_reviewable(
    runtime: Runtime,
    reviewer: Any,
    deadlines: ToolContract,
    django_capture_on_commit_callbacks: Any,
) -> None:
    occurrence_id = proposed(runtime)
    in_time = proposed(runtime, "r2")
    body = runtime.get(f"/api/v1/occurrences/{occurrence_id}").json()
    assert body["review_deadline_at"] is not None and body["final_deadline_at"] is not None
    pass_review_deadline(occurrence_id)
    before = sample("console_review_deadlines", "escalated")

    with django_capture_on_commit_callbacks(execute=True):
        assert review_deadlines_apply() == (1, 0)
    assert review_deadlines_apply() == (0, 0)

    assert sample("console_review_deadlines", "escalated") == before + 1
    body = runtime.get(f"/api/v1/occurrences/{occurrence_id}").json()
    assert body["status"] == "pending_review"
    assert body["escalated_at"] is not None
    assert runtime.get(f"/api/v1/occurrences/{in_time}").json()["escalated_at"] is None
    event = AuditEvent.objects.get(occurrence_id=occurrence_id, kind="occurrence.escalated")
    assert (event.actor, event.decision, event.reason_code) == (
        "console",
        "escalated",
        "review_deadline_passed",
    )
    assert approve(occurrence_id, reviewer).issued


# --- the final deadline -----------------------------------------------------------------------


def test_past_the_final_deadline_a_request_times_out_recorded_and_audited(
    runtime: Runtime, deadlines: ToolContract, django_capture_on_commit_callbacks: Any
) -> None:
    occurrence_id = proposed(runtime)
    pass_final_deadline(occurrence_id)
    before = sample("console_review_deadlines", "timed_out")

    with django_capture_on_commit_callbacks(execute=True):
        assert review_deadlines_sweep() == 2  # escalated, then timed out
    assert review_deadlines_apply() == (0, 0)

    assert sample("console_review_deadlines", "timed_out") == before + 1
    exposed, _ = metrics.exposition()
    assert b'console_review_deadlines_total{event="timed_out"}' in exposed
    assert b'console_review_deadlines_total{event="escalated"}' in exposed
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    assert occurrence.status == Occurrence.Status.TIMED_OUT
    assert occurrence.decided_at is not None
    assert occurrence.rejection_reason == ""
    kinds = list(
        AuditEvent.objects.filter(occurrence_id=occurrence_id)
        .order_by("id")
        .values_list("kind", flat=True)
    )
    assert kinds == ["occurrence.proposed", "occurrence.escalated", "occurrence.timed_out"]
    event = AuditEvent.objects.get(occurrence_id=occurrence_id, kind="occurrence.timed_out")
    assert (event.actor, event.decision, event.reason_code) == (
        "console",
        "timed_out",
        "final_deadline_passed",
    )
    assert event.data["deadline"] == "final"
    assert occurrence.final_deadline_at is not None
    assert event.data["final_deadline_at"] == occurrence.final_deadline_at.isoformat()

    body = runtime.get(f"/api/v1/occurrences/{occurrence_id}").json()
    assert body["status"] == "timed_out"
    assert body["approval"] is None
    token = runtime.token(occurrence_id)
    assert token.status_code == 409
    assert token.json()["error"]["code"] == "timed_out"


def test_nothing_can_decide_a_timed_out_request(
    runtime: Runtime, reviewer: Any, deadlines: ToolContract
) -> None:
    occurrence_id = proposed(runtime)
    pass_final_deadline(occurrence_id)
    review_deadlines_apply()

    with pytest.raises(ServiceError) as raised:
        approve(occurrence_id, reviewer)
    assert raised.value.code == ErrorCode.TIMED_OUT
    with pytest.raises(ServiceError) as raised:
        occurrence_reject(
            occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason="late"
        )
    assert raised.value.code == ErrorCode.TIMED_OUT
    assert Occurrence.objects.get(pk=occurrence_id).status == Occurrence.Status.TIMED_OUT
    assert not AuditEvent.objects.filter(
        occurrence_id=occurrence_id, kind__in=["approval.issued", "occurrence.rejected"]
    ).exists()


def test_past_the_final_deadline_approval_is_refused_before_the_sweep_runs(
    runtime: Runtime, reviewer: Any, deadlines: ToolContract
) -> None:
    occurrence_id = proposed(runtime)
    pass_final_deadline(occurrence_id)

    with pytest.raises(ServiceError) as raised:
        approve(occurrence_id, reviewer)
    assert raised.value.code == ErrorCode.TIMED_OUT
    assert Occurrence.objects.get(pk=occurrence_id).status == Occurrence.Status.PENDING_REVIEW
    assert review_deadlines_apply() == (1, 1)


def test_a_decided_request_is_never_timed_out(
    runtime: Runtime, reviewer: Any, deadlines: ToolContract
) -> None:
    approved = proposed(runtime)
    assert approve(approved, reviewer).issued
    pass_final_deadline(approved)
    assert review_deadlines_apply() == (0, 0)
    assert Occurrence.objects.get(pk=approved).status == Occurrence.Status.APPROVED


def test_the_agent_may_propose_again_and_is_told_of_the_timeout(
    runtime: Runtime, deadlines: ToolContract
) -> None:
    first = proposed(runtime)
    pass_final_deadline(first)
    review_deadlines_apply()

    # The same client_ref is the same tool call: its answer is the timed-out request.
    again = runtime.propose(client_ref="r1")
    assert again.status_code == 200
    assert again.json()["occurrence_id"] == first
    assert again.json()["status"] == "timed_out"

    second = runtime.propose(client_ref="r1-retry")
    assert second.status_code == 201
    body = second.json()
    assert body["status"] == "pending_review"
    assert body["prior_decisions"] == [
        {
            "occurrence_id": first,
            "decision": "timed_out",
            "reason": "Nobody decided it before its final deadline.",
            "decided_at": body["prior_decisions"][0]["decided_at"],
            "decided_by": "console",
        }
    ]
    assert body["prior_decisions"][0]["decided_at"] is not None


def test_a_timeout_does_not_make_a_repeat_rejected_by_policy(
    runtime: Runtime, deadlines: ToolContract
) -> None:
    ToolContract.objects.filter(name="issue_refund").update(reject_repeats=True)
    first = proposed(runtime)
    pass_final_deadline(first)
    review_deadlines_apply()
    assert runtime.propose(client_ref="r2").json()["status"] == "pending_review"


# --- the callback -----------------------------------------------------------------------------


def test_a_registered_callback_is_told_timed_out(
    runtime: Runtime, deadlines: ToolContract, settings: Any
) -> None:
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    registered = runtime.client.put(
        "/api/v1/callback",
        '{"url": "http://127.0.0.1:9/hooks"}',
        content_type="application/json",
    )
    assert registered.status_code in (200, 201), registered.content
    occurrence_id = proposed(runtime)
    pass_review_deadline(occurrence_id)
    review_deadlines_apply()
    assert not CallbackDelivery.objects.filter(occurrence_id=occurrence_id).exists()

    pass_final_deadline(occurrence_id)
    review_deadlines_apply()

    delivery = CallbackDelivery.objects.get(occurrence_id=occurrence_id)
    assert delivery.event == "timed_out"
    assert delivery.body["event"] == "timed_out"
    assert delivery.body["status"] == "timed_out"
    assert delivery.body["decided_by"] == "console"
    assert delivery.body["details"]["final_deadline_at"]


# --- the long-poll --------------------------------------------------------------------------


def _time_out_in_another_connection(occurrence_id: str) -> None:
    from django.db import connection as thread_connection

    try:
        # One transaction: moving the deadline is a change the poll would wake for (and
        # answer still pending) if it committed before the timeout did.
        with transaction.atomic():
            pass_final_deadline(occurrence_id)
            assert review_deadlines_apply() == (0, 1)
    finally:
        thread_connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_waiting_long_poll_wakes_and_answers_timed_out(
    runtime: Runtime, deadlines: ToolContract, settings: Any
) -> None:
    settings.LONG_POLL_FALLBACK_SECONDS = 0.05
    occurrence_id = proposed(runtime)
    # Escalated before the poll starts: the escalation is a change the poll would answer
    # at once (it NOTIFYs), and the one awaited here is the timeout.
    Occurrence.objects.filter(pk=occurrence_id).update(
        review_deadline_at=timezone.now() - timedelta(minutes=1)
    )
    assert review_deadlines_apply() == (1, 0)
    etag = runtime.get(f"/api/v1/occurrences/{occurrence_id}")["ETag"]
    timer = threading.Timer(0.5, _time_out_in_another_connection, args=(occurrence_id,))
    timer.start()
    try:
        started = time.monotonic()
        answer = runtime.get(
            f"/api/v1/occurrences/{occurrence_id}?wait=30", HTTP_IF_NONE_MATCH=etag
        )
    finally:
        timer.join()
    assert time.monotonic() - started < 10
    assert answer.status_code == 200
    assert answer.json()["status"] == "timed_out"
    assert answer.json()["escalated_at"] is not None


# --- back in review: the deadlines run again ----------------------------------------------------


def test_a_renewal_or_an_edit_after_approval_restarts_the_deadlines(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, deadlines: ToolContract
) -> None:
    renewed = proposed(runtime)
    edited = proposed(runtime, "r2")
    for occurrence_id in (renewed, edited):
        assert approve(occurrence_id, reviewer).issued
        pass_final_deadline(occurrence_id)
        Occurrence.objects.filter(pk=occurrence_id).update(escalated_at=timezone.now())
    past = timezone.now() - timedelta(minutes=1)
    Approval.objects.filter(occurrence_id=renewed).update(
        issued_at=past - timedelta(minutes=15), expires_at=past
    )

    occurrence_renew(occurrence=Occurrence.objects.get(pk=renewed), actor="runtime:agent")
    current = Occurrence.objects.get(pk=edited).proposals.get(is_current=True)
    proposal_edit(
        occurrence=Occurrence.objects.get(pk=edited),
        editor=second_reviewer,
        arguments={**current.arguments, "amount_minor": 7000},
        seen_digest=current.action_digest,
    )

    for occurrence_id in (renewed, edited):
        occurrence = Occurrence.objects.get(pk=occurrence_id)
        assert occurrence.status == Occurrence.Status.PENDING_REVIEW
        assert occurrence.escalated_at is None
        assert occurrence.final_deadline_at is not None
        assert occurrence.final_deadline_at > timezone.now() + timedelta(hours=1)
    assert review_deadlines_apply() == (0, 0)
    assert approve(renewed, reviewer).issued
    assert approve(edited, reviewer).issued


def test_an_edit_of_a_pending_request_keeps_its_deadlines_and_is_refused_after_the_final_one(
    runtime: Runtime, reviewer: Any, deadlines: ToolContract
) -> None:
    occurrence_id = proposed(runtime)
    pass_final_deadline(occurrence_id)
    current = Occurrence.objects.get(pk=occurrence_id).proposals.get(is_current=True)
    with pytest.raises(ServiceError) as raised:
        proposal_edit(
            occurrence=Occurrence.objects.get(pk=occurrence_id),
            editor=reviewer,
            arguments={**current.arguments, "amount_minor": 7000},
            seen_digest=current.action_digest,
        )
    assert raised.value.code == ErrorCode.TIMED_OUT


# --- the pages --------------------------------------------------------------------------------


def test_the_pages_show_escalated_then_timed_out_and_refuse_a_late_approval(
    runtime: Runtime, reviewer: Any, deadlines: ToolContract
) -> None:
    from tests.approvals.test_views_html import parse, signed_in

    occurrence_id = proposed(runtime)
    Occurrence.objects.filter(pk=occurrence_id).update(
        created_at=timezone.now() - timedelta(minutes=35)
    )
    pass_review_deadline(occurrence_id)
    review_deadlines_apply()
    client = signed_in(reviewer)

    inbox = client.get("/reviews/").content.decode()
    assert "Escalated: waiting 35 min" in inbox
    page = parse(client.get(f"/reviews/{occurrence_id}/"))
    assert "Escalated: waiting 35 min" in page.text("escalated")
    assert page.has("approve-form")
    digest = Occurrence.objects.get(pk=occurrence_id).proposals.get().action_digest

    pass_final_deadline(occurrence_id)  # the sweep has not run: the clock decided already
    response = client.post(
        f"/reviews/{occurrence_id}/approve",
        {"action_digest": digest},
        headers={"HX-Request": "true"},
    )
    page = parse(response)
    assert page.attr("decision-panel", "data-state") == "timed_out"
    assert "final deadline" in page.text("decision-message")
    assert not page.has("approve-form") and not page.has("reject-form")
    assert not Approval.objects.filter(occurrence_id=occurrence_id).exists()

    review_deadlines_apply()
    page = parse(client.get(f"/reviews/{occurrence_id}/"))
    assert page.attr("decision-panel", "data-state") == "timed_out"
    assert "Timed out" in page.text("timed-out")
    assert page.attr("decision-panel", "hx-get") is None  # final: no more polling
    filtered = client.get("/reviews/?state=timed_out").content.decode()
    assert occurrence_id in filtered
