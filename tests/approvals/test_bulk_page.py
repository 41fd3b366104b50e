"""The bulk review page (``/reviews/bulk/``) and the inbox's selection and filters."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from approvals.models import Approval, AuditEvent, Membership, Occurrence, Tenant
from approvals.reviews.bulk import BULK_MAX
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from approvals.reviews.proposals import occurrence_propose
from tests.approvals.test_views_html import parse, signed_in
from tests.conftest import REFUND_ARGS, Runtime, make_user

pytestmark = pytest.mark.django_db


def propose(runtime: Runtime, n: int, run: str = "run-1", by: str = "agent", **args: Any) -> str:
    occurrence, _ = occurrence_propose(
        runtime_key=runtime.key,
        tool="issue_refund",
        arguments={**REFUND_ARGS, "payment_id": f"pay_{n}", **args},
        run_id=run,
        reason="bulk",
        requested_by=by,
    )
    return str(occurrence.pk)


def items_of(page: Any) -> list[str]:
    return re.findall(r'name="item" value="([^"]+)"', page.content.decode())


def test_the_page_shows_each_action_its_digest_and_what_differs(
    runtime: Runtime, reviewer: Any
) -> None:
    ids = [propose(runtime, n, amount_minor=1000 + n) for n in range(3)]
    page = signed_in(reviewer).get("/reviews/bulk/", {"ids": ids})
    assert page.status_code == 200
    html = page.content.decode()
    for pk in ids:
        proposal = Occurrence.objects.get(pk=pk).proposals.get(is_current=True)
        assert proposal.action_digest in html  # the full digest
        assert f'id="bulk-{pk}"' in html
    assert html.count("<details") == 3
    differences = parse(page).text("bulk-differences")
    assert "amount_minor" in differences and "payment_id" in differences
    assert "currency" not in differences
    # The differing arguments' lines are marked inside the canonical JSON; the rest is not.
    assert '    <mark class="bulk-diff">&quot;amount_minor&quot;: 1001,</mark>' in html
    assert '<mark class="bulk-diff">&quot;currency&quot;' not in html
    assert f"At most {BULK_MAX} requests per batch" in html


def test_agent_text_is_escaped(runtime: Runtime, reviewer: Any) -> None:
    ids = [
        propose(runtime, 1, by="<script>alert(1)</script>", reason="<b>x</b>"),
        propose(runtime, 2, reason="<img src=x onerror=alert(1)>"),
    ]
    html = signed_in(reviewer).get("/reviews/bulk/", {"ids": ids}).content.decode()
    assert "<script>alert(1)" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_approving_the_batch_binds_each_approval_to_its_digest(
    runtime: Runtime, reviewer: Any
) -> None:
    ids = [propose(runtime, n) for n in range(4)]
    client = signed_in(reviewer, enforce_csrf_checks=True)
    page = client.get("/reviews/bulk/", {"ids": ids})
    token = client.cookies["csrftoken"].value

    answer = client.post(
        "/reviews/bulk/",
        {"item": items_of(page), "decision": "approve", "csrfmiddlewaretoken": token},
    )

    assert answer.status_code == 200
    assert "Approved 4 of 4 requests" in answer.content.decode()
    for pk in ids:
        proposal = Occurrence.objects.get(pk=pk).proposals.get(is_current=True)
        assert Approval.objects.get(occurrence_id=pk).action_digest == proposal.action_digest
    assert 'id="bulk-approve"' not in answer.content.decode()  # nothing left to decide


def test_a_post_without_the_csrf_token_is_refused(runtime: Runtime, reviewer: Any) -> None:
    ids = [propose(runtime, n) for n in range(2)]
    client = signed_in(reviewer, enforce_csrf_checks=True)
    page = client.get("/reviews/bulk/", {"ids": ids})
    answer = client.post("/reviews/bulk/", {"item": items_of(page), "decision": "approve"})
    assert answer.status_code == 403
    assert not Approval.objects.exists()


def test_a_request_changed_after_rendering_refuses_the_batch_and_is_named(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    ids = [propose(runtime, n) for n in range(3)]
    client = signed_in(reviewer)
    page = client.get("/reviews/bulk/", {"ids": ids})
    changed = Occurrence.objects.get(pk=ids[1])
    proposal_edit(
        occurrence=changed,
        editor=second_reviewer,
        arguments={**REFUND_ARGS, "payment_id": "pay_1", "amount_minor": 10},
        seen_digest=changed.proposals.get(is_current=True).action_digest,
    )

    answer = client.post("/reviews/bulk/", {"item": items_of(page), "decision": "approve"})

    assert answer.status_code == 409
    html = answer.content.decode()
    assert f"request {ids[1][:8]} stopped the batch" in html
    assert "version 1 was shown, version 2 is current" in html
    assert re.search(rf'class="card bulk-item bulk-item--refused" id="bulk-{ids[1]}"', html)
    assert not Approval.objects.exists()
    assert not AuditEvent.objects.filter(kind="approval.vote_recorded").exists()


def test_more_than_the_bound_is_a_400_that_says_the_bound(reviewer: Any) -> None:
    ids = [str(uuid.uuid4()) for _ in range(BULK_MAX + 1)]
    client = signed_in(reviewer)
    page = client.get("/reviews/bulk/", {"ids": ids})
    assert page.status_code == 400
    assert f"at most {BULK_MAX} requests; {BULK_MAX + 1} were selected" in page.content.decode()
    items = [f"{pk}:1:{'0' * 64}" for pk in ids]
    answer = client.post("/reviews/bulk/", {"item": items, "decision": "approve"})
    assert answer.status_code == 400
    assert f"at most {BULK_MAX} requests" in answer.content.decode()


def test_bad_input_is_a_400_not_a_500(reviewer: Any) -> None:
    client = signed_in(reviewer)
    assert client.get("/reviews/bulk/", {"ids": ["nope"]}).status_code == 400
    answer = client.post("/reviews/bulk/", {"item": ["x:y:z"], "decision": "approve"})
    assert answer.status_code == 400


def test_another_tenants_request_is_left_out_and_refused(
    runtime: Runtime, other_runtime: Runtime, reviewer: Any
) -> None:
    mine = propose(runtime, 1)
    theirs, _ = occurrence_propose(
        runtime_key=other_runtime.key,
        tool="issue_refund",
        arguments={**REFUND_ARGS, "payment_id": "pay_x"},
        run_id="run-x",
        reason="secret reason of globex",
    )
    client = signed_in(reviewer)
    page = client.get("/reviews/bulk/", {"ids": [mine, str(theirs.pk)]})
    html = page.content.decode()
    assert str(theirs.pk) not in html
    assert "1 selected request is not in your tenants" in html

    proposal = theirs.proposals.get(is_current=True)
    forged = f"{theirs.pk}:{proposal.version}:{proposal.action_digest}"
    answer = client.post(
        "/reviews/bulk/", {"item": [*items_of(page), forged], "decision": "approve"}
    )
    assert answer.status_code == 404
    assert not Approval.objects.exists()


def test_a_person_who_reviews_nowhere_is_refused(tenant: Tenant) -> None:
    admin_only = make_user("adele", tenant, Membership.Role.ADMIN)
    assert signed_in(admin_only).get("/reviews/bulk/").status_code == 403


def test_a_bulk_rejection_needs_its_reason(runtime: Runtime, reviewer: Any) -> None:
    ids = [propose(runtime, n) for n in range(2)]
    client = signed_in(reviewer)
    items = items_of(client.get("/reviews/bulk/", {"ids": ids}))
    answer = client.post("/reviews/bulk/", {"item": items, "decision": "reject", "reason": ""})
    assert answer.status_code == 400
    answer = client.post(
        "/reviews/bulk/", {"item": items, "decision": "reject", "reason": "Duplicates"}
    )
    assert answer.status_code == 200
    assert Occurrence.objects.filter(status=Occurrence.Status.REJECTED).count() == 2


# --- the inbox: a checkbox per pending row, and filters for requester, run, amount ------


def test_the_pending_inbox_offers_a_checkbox_per_row_and_review_selected(
    runtime: Runtime, reviewer: Any
) -> None:
    ids = [propose(runtime, n) for n in range(2)]
    page = parse(signed_in(reviewer).get("/reviews/"))
    assert page.attr(f"select-{ids[0]}", "form") == "inbox-bulk"
    assert page.attr("inbox-bulk", "action") == "/reviews/bulk/"
    assert f"at most {BULK_MAX}" in page.text("bulk-count")
    other_state = parse(signed_in(reviewer).get("/reviews/", {"state": "all"}))
    assert f"select-{ids[0]}" not in other_state.by_id


def row_ids(response: Any) -> set[str]:
    return set(re.findall(r'<tr data-occurrence-id="([^"]+)"', response.content.decode()))


def test_the_inbox_filters_by_requester_run_and_amount(runtime: Runtime, reviewer: Any) -> None:
    small = propose(runtime, 1, run="run-a", by="ana", amount_minor=5000)  # EUR 50.00
    large = propose(runtime, 2, run="run-b", by="ana", amount_minor=90000)  # EUR 900.00
    yen = propose(runtime, 3, run="run-a", by="bo", amount_minor=900, currency="JPY")  # JPY 900
    client = signed_in(reviewer)

    assert row_ids(client.get("/reviews/", {"requester": "ana"})) == {small, large}
    assert row_ids(client.get("/reviews/", {"run": "run-a"})) == {small, yen}
    assert row_ids(client.get("/reviews/", {"amount_min": "100"})) == {large, yen}
    assert row_ids(client.get("/reviews/", {"amount_min": "100", "amount_max": "899"})) == set()
    assert row_ids(client.get("/reviews/", {"amount_max": "900"})) == {small, large, yen}
    assert row_ids(client.get("/reviews/", {"amount_max": "50"})) == {small}
    both = client.get("/reviews/", {"requester": "ana", "amount_min": "100"})
    assert row_ids(both) == {large}
    # The poll keeps the filters.
    assert "requester=ana" in both.content.decode() and "amount_min=100" in both.content.decode()


def test_the_page_warns_of_a_request_the_reader_may_not_approve(
    runtime: Runtime, reviewer: Any
) -> None:
    ids = [propose(runtime, 1), propose(runtime, 2, by="rita")]
    client = signed_in(reviewer)
    page = client.get("/reviews/bulk/", {"ids": ids})
    html = page.content.decode()
    assert "1 of these is a request you may not approve" in html
    assert "You requested this one" in html
    answer = client.post("/reviews/bulk/", {"item": items_of(page), "decision": "approve"})
    assert answer.status_code == 403
    assert f"request {ids[1][:8]} stopped the batch" in answer.content.decode()
    assert not Approval.objects.exists()


def test_a_request_decided_since_rendering_is_named(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    ids = [propose(runtime, n) for n in range(3)]
    client = signed_in(reviewer)
    page = client.get("/reviews/bulk/", {"ids": ids})
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=ids[2]), reviewer=second_reviewer, reason="No"
    )
    answer = client.post("/reviews/bulk/", {"item": items_of(page), "decision": "approve"})
    assert answer.status_code == 409
    html = answer.content.decode()
    assert f"request {ids[2][:8]} stopped the batch" in html
    assert "It was decided since the page was rendered (it is rejected)" in html
    assert "Continue with the pending ones only" in html
    assert not Approval.objects.exists()


def test_a_request_above_its_quorum_gets_a_vote_and_the_page_says_so(
    runtime: Runtime, reviewer: Any
) -> None:
    ids = [propose(runtime, 1), propose(runtime, 2, amount_minor=90000)]
    client = signed_in(reviewer)
    page = client.get("/reviews/bulk/", {"ids": ids})
    answer = client.post("/reviews/bulk/", {"item": items_of(page), "decision": "approve"})
    assert answer.status_code == 200
    assert "Approved 1 of 2 requests; 1 still needs another reviewer" in answer.content.decode()
    assert Occurrence.objects.get(pk=ids[1]).status == Occurrence.Status.PENDING_REVIEW
