"""The demo's seed (``manage.py seed_demo``, run by ``bin/demo``): its accounts and a
working runtime key, a request that escalates and times out within minutes, and five alike
refunds of one run that a newcomer decides together on the bulk review page."""

from __future__ import annotations

import io
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from approvals.models import Approval, Occurrence, RuntimeKey
from demo.management.commands.seed_demo import DEMO_BULK_RUN
from tests.approvals.test_views_html import parse

pytestmark = pytest.mark.django_db


def seed() -> str:
    out = io.StringIO()
    call_command("seed_demo", stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_seed_demo_refuses_to_run_with_debug_off(settings: Any) -> None:
    settings.DEBUG = False

    with pytest.raises(CommandError, match="runs only with DEBUG on"):
        seed()
    assert not RuntimeKey.objects.exists()


def test_seed_demo_twice_keeps_one_set_of_proposals_and_prints_a_working_key(
    settings: Any,
) -> None:
    settings.DEBUG = True
    seed()
    output = seed()

    raw = output.splitlines()[-1].strip().removeprefix("export KEY=")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/audit/events").status_code == 200
    assert Occurrence.objects.count() == 10  # five requests of all kinds, five for bulk review
    assert RuntimeKey.objects.count() == 2
    # One demo request has short deadlines: a newcomer sees it escalate, then time out.
    close = Occurrence.objects.get(tool__name="close_ticket")
    assert close.review_deadline_at is not None and close.final_deadline_at is not None
    assert close.final_deadline_at - close.review_deadline_at == timedelta(minutes=3)


def _inbox_ids(client: Client, **filters: str) -> list[str]:
    page = client.get("/reviews/", filters).content.decode()
    return re.findall(r'name="ids" value="([^"]+)"', page)


def test_the_seed_leaves_five_alike_refunds_of_one_run_to_decide_in_bulk(settings: Any) -> None:
    settings.DEBUG = True
    seed()
    batch = Occurrence.objects.filter(run_id=DEMO_BULK_RUN)
    assert batch.count() == 5
    assert {o.tool.name for o in batch} == {"issue_refund"}
    assert {o.status for o in batch} == {Occurrence.Status.PENDING_REVIEW}

    # As the README's tour goes: the reviewer filters the inbox by the run, ticks them all
    # and opens them together.
    reviewer = Client()
    assert reviewer.login(username="reviewer", password="reviewer-demo")
    ids = _inbox_ids(reviewer, run=DEMO_BULK_RUN)
    assert sorted(ids) == sorted(str(o.pk) for o in batch)
    page = reviewer.get("/reviews/bulk/", {"ids": ids})
    assert page.status_code == 200
    html = page.content.decode()
    for occurrence in batch:
        assert occurrence.proposals.get(is_current=True).action_digest in html
    # They differ in the payment and the amount only, which the page marks.
    differences = parse(page).text("bulk-differences")
    assert "amount_minor" in differences and "payment_id" in differences
    assert "currency" not in differences

    # One reviewer's one decision approves all five: none is large enough to need two.
    items = re.findall(r'name="item" value="([^"]+)"', html)
    answer = reviewer.post("/reviews/bulk/", {"item": items, "decision": "approve"})
    assert answer.status_code == 200, answer.content
    approvals = Approval.objects.filter(occurrence__run_id=DEMO_BULK_RUN)
    assert approvals.count() == 5
    assert {a.approver for a in approvals} == {get_user_model().objects.get(username="reviewer")}
    # Each bound to the digest shown for its own request.
    for approval in approvals:
        current = approval.occurrence.proposals.get(is_current=True)
        assert approval.action_digest == current.action_digest
