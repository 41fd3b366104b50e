"""After approval, "Edit arguments…" is offered only as "Edit and withdraw this approval",
saying so plainly; the service's rule (an edit supersedes an unclaimed approval) holds,
and an edit posted from a form that did not say it is refused with nothing saved."""

from __future__ import annotations

import json
from typing import Any

from approvals.models import Approval, Occurrence
from tests.approvals.test_views_html import parse, propose, signed_in
from tests.conftest import REFUND_ARGS, Runtime, approve

EDITED = json.dumps(dict(REFUND_ARGS, amount_minor=7000))


def digest_of(occurrence_id: str) -> str:
    return str(
        Occurrence.objects.get(pk=occurrence_id).proposals.get(is_current=True).action_digest
    )


def test_a_pending_request_offers_a_plain_edit(runtime: Runtime, reviewer: Any) -> None:
    pending = propose(runtime)
    page = parse(signed_in(reviewer).get(f"/reviews/{pending}/"))
    assert "Edit arguments…" in page.text("edit-section")
    assert not page.has("edit-withdraws")
    assert 'name="withdraw_approval"' not in page.source


def test_an_approved_request_offers_edit_and_withdraw_saying_what_it_does(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    approved = propose(runtime)
    approve(approved, reviewer)
    page = parse(signed_in(second_reviewer).get(f"/reviews/{approved}/"))
    section = page.text("edit-section")
    assert "Edit and withdraw this approval…" in section
    assert "Edit arguments…" not in section
    assert "withdraws the approval of version 1" in " ".join(page.text("edit-withdraws").split())
    assert 'name="withdraw_approval" value="1"' in page.source
    assert "Withdraw the approval and save version 2" in section


def test_saving_from_the_withdraw_form_supersedes_the_approval(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    approved = propose(runtime)
    approve(approved, reviewer)
    response = signed_in(second_reviewer).post(
        f"/reviews/{approved}/edit",
        {"arguments": EDITED, "action_digest": digest_of(approved), "withdraw_approval": "1"},
    )
    assert response.status_code == 302
    approval = Approval.objects.get(occurrence_id=approved)
    assert approval.superseded_at is not None
    assert Occurrence.objects.get(pk=approved).status == Occurrence.Status.PENDING_REVIEW


def test_an_edit_from_a_form_opened_before_the_approval_is_refused_and_saves_nothing(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    digest = digest_of(occurrence_id)  # the page was opened while it was pending
    approve(occurrence_id, reviewer)
    response = signed_in(second_reviewer).post(
        f"/reviews/{occurrence_id}/edit", {"arguments": EDITED, "action_digest": digest}
    )
    assert response.status_code == 409
    page = parse(response)
    assert "saving would withdraw that approval" in page.source
    assert "Nothing was saved" in page.source
    # The reviewer's text is kept, in the form that says what saving does.
    assert page.has("edit-withdraws")
    assert "7000" in page.text("edit-arguments")
    approval = Approval.objects.get(occurrence_id=occurrence_id)
    assert approval.superseded_at is None and approval.state == "issued"
    assert Occurrence.objects.get(pk=occurrence_id).proposals.count() == 1
