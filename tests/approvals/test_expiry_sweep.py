"""The expiry sweep writes down what the clock decided, so that the inbox's filters and
counts agree with its badges; a claim never waited for it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import Approval, AuditEvent, Occurrence
from approvals.reviews import expiry
from approvals.reviews.expiry import approvals_expire
from tests.conftest import PASSWORD, Runtime, approve

pytestmark = pytest.mark.django_db


def expire_now(occurrence_id: str) -> None:
    # PostgreSQL's now() is the test transaction's start, before the fixtures ran.
    past = timezone.now() - timedelta(minutes=5)
    Approval.objects.filter(occurrence_id=occurrence_id).update(
        issued_at=past - timedelta(minutes=15), expires_at=past
    )


def test_an_issued_approval_past_its_expiry_is_marked_expired_once(
    runtime: Runtime, reviewer: Any, approved: str
) -> None:
    expire_now(approved)

    assert approvals_expire() == 1
    assert approvals_expire() == 0

    approval = Approval.objects.get(occurrence_id=approved)
    assert approval.state == Approval.State.EXPIRED
    assert Occurrence.objects.get(pk=approved).status == Occurrence.Status.EXPIRED
    event = AuditEvent.objects.get(kind="approval.expired")
    assert (event.actor, event.decision, event.reason_code) == (
        "clock",
        "expired",
        "expired_unclaimed",
    )


def test_approvals_in_time_and_consumed_ones_are_left_alone(
    runtime: Runtime, reviewer: Any, token: str, approved: str
) -> None:
    claim = runtime.claim(token, "exec-1")
    assert claim.status_code == 200
    expire_now(approved)
    fresh = runtime.propose(client_ref="fresh").json()["occurrence_id"]
    approve(fresh, reviewer)

    assert approvals_expire() == 0
    assert Approval.objects.get(occurrence_id=approved).state == Approval.State.CONSUMED
    assert Approval.objects.get(occurrence_id=fresh).state == Approval.State.ISSUED


def test_a_claim_after_the_sweep_is_expired(runtime: Runtime, token: str, approved: str) -> None:
    expire_now(approved)
    approvals_expire()

    response = runtime.claim(token, "exec-1")

    assert response.status_code == 403
    assert {k: response.json()[k] for k in ("decision", "reason")} == {
        "decision": "expired",
        "reason": "expired",
    }


def test_the_inbox_filters_agree_with_the_badges_after_the_sweep(
    runtime: Runtime, reviewer: Any, approved: str
) -> None:
    expire_now(approved)
    approvals_expire()
    client = Client()
    client.login(username=reviewer.username, password=PASSWORD)

    approved_list = client.get("/reviews/?state=approved").content.decode()
    expired_list = client.get("/reviews/?state=expired").content.decode()

    assert approved not in approved_list
    assert approved in expired_list and "Expired" in expired_list


def test_the_beat_task_sweeps_batch_after_batch(
    runtime: Runtime, reviewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from approvals import tasks

    monkeypatch.setattr(expiry, "EXPIRE_BATCH", 2)
    ids = []
    for n in range(5):
        occurrence_id = runtime.propose(client_ref=f"batch-{n}").json()["occurrence_id"]
        approve(occurrence_id, reviewer)
        expire_now(occurrence_id)
        ids.append(occurrence_id)

    assert tasks.approvals_expire() == 5
    assert set(Approval.objects.filter(occurrence_id__in=ids).values_list("state", flat=True)) == {
        Approval.State.EXPIRED
    }
    assert AuditEvent.objects.filter(kind="approval.expired").count() == 5
    assert tasks.approvals_expire() == 0
