"""Deciding in the console: approve, reject, edit and revoke, each re-rendered from the
database whether it won or lost; htmx gets the panel, a plain form post a redirect."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals.audit.record import audit_record
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Command,
    Membership,
    Occurrence,
    Tenant,
)
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from approvals.reviews.revocation import approval_revoke
from tests.approvals.test_views_html import Html, parse, propose, signed_in
from tests.conftest import REFUND_ARGS, Runtime, approve, make_user

HTMX = {"HX-Request": "true"}
BIG_REFUND = dict(REFUND_ARGS, amount_minor=129900)  # above the quorum threshold: 2 approvers


def digest_of(occurrence_id: str) -> str:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    return occurrence.proposals.get(is_current=True).action_digest


def state(page: Html) -> str | None:
    return page.attr("decision-panel", "data-state")


@pytest.fixture
def pending(runtime: Runtime) -> str:
    return propose(runtime)


# --- approve -------------------------------------------------------------------------


def test_approve_without_htmx_redirects_back_to_the_page(reviewer: Any, pending: str) -> None:
    client = signed_in(reviewer)
    response = client.post(f"/reviews/{pending}/approve", {"action_digest": digest_of(pending)})
    assert response.status_code == 302
    assert response["Location"] == f"/reviews/{pending}/"
    page = parse(client.get(response["Location"]))
    assert state(page) == "issued"
    assert "Approved" in page.text("decision-message")
    assert not page.has("approve-form") and not page.has("reject-form")


def test_approve_with_htmx_returns_the_decision_panel(reviewer: Any, pending: str) -> None:
    client = signed_in(reviewer)
    response = client.post(
        f"/reviews/{pending}/approve", {"action_digest": digest_of(pending)}, headers=HTMX
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html
    page = parse(response)
    assert state(page) == "issued"
    # Not live regions themselves: console.js says the notice in the page's one region.
    assert page.attr("decision-panel", "aria-live") is None
    assert page.text("decision-message") in str(page.attr("decision-panel", "data-announce-notice"))
    # The panel keeps polling until the approval is used, revoked or expired.
    assert page.attr("decision-panel", "hx-trigger") == "every 2s"
    assert str(page.attr("decision-panel", "hx-get")).startswith(f"/reviews/{pending}/panel?")
    # The rest of the page that changed comes along out of band.
    assert page.attr("history", "hx-swap-oob") == "true"
    assert page.attr("occurrence-status", "hx-swap-oob") == "true"
    assert "approval.issued" in page.text("history")


def test_quorum_shows_who_approved_and_who_is_still_needed(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence_id = propose(runtime, arguments=BIG_REFUND)
    page = parse(signed_in(reviewer).get(f"/reviews/{occurrence_id}/"))
    assert page.text("quorum").split() == ["0", "of", "2", "approvals"]

    response = signed_in(reviewer).post(
        f"/reviews/{occurrence_id}/approve",
        {"action_digest": digest_of(occurrence_id)},
        headers=HTMX,
    )
    page = parse(response)
    assert state(page) == "awaiting_quorum"
    assert " ".join(page.text("quorum").split()) == "1 of 2 approvals"
    assert "Approved by rita" in page.text("decision-panel")
    assert "ravi can approve" in page.text("decision-panel")
    # rita has voted: she is not offered the button again.
    assert not page.has("approve-form")

    other = parse(signed_in(second_reviewer).get(f"/reviews/{occurrence_id}/"))
    assert state(other) == "awaiting_quorum"
    assert other.has("approve-form")
    response = signed_in(second_reviewer).post(
        f"/reviews/{occurrence_id}/approve",
        {"action_digest": digest_of(occurrence_id)},
        headers=HTMX,
    )
    assert state(parse(response)) == "issued"


def test_stale_digest_without_htmx_shows_the_new_version_and_what_changed(
    reviewer: Any, second_reviewer: Any, pending: str
) -> None:
    seen = digest_of(pending)
    proposal_edit(
        occurrence=Occurrence.objects.get(pk=pending),
        editor=second_reviewer,
        arguments=dict(REFUND_ARGS, amount_minor=9000),
        seen_digest=seen,
    )
    client = signed_in(reviewer)
    response = client.post(f"/reviews/{pending}/approve", {"action_digest": seen})
    assert response.status_code == 302
    assert response["Location"] == f"/reviews/{pending}/?since={seen}"

    page = parse(client.get(response["Location"]))
    new = digest_of(pending)
    assert page.text("action-digest") == new != seen
    assert "The action changed after you opened it" in page.text("decision-message")
    assert "9000" in page.text("version-diff") and "8000" in page.text("version-diff")
    assert "Changed since the version you saw" in page.text("version-diff")
    assert state(page) == "pending"
    # The approve form now carries the new digest; nothing was recorded for the old one.
    approve_digest = next(
        t.attrs["value"] for t in page.find_all("input") if t.attrs.get("name") == "action_digest"
    )
    assert approve_digest == new
    assert not ApprovalVote.objects.filter(proposal__occurrence_id=pending).exists()


def test_stale_digest_with_htmx_swaps_in_the_whole_review(
    reviewer: Any, second_reviewer: Any, pending: str
) -> None:
    seen = digest_of(pending)
    proposal_edit(
        occurrence=Occurrence.objects.get(pk=pending),
        editor=second_reviewer,
        arguments=dict(REFUND_ARGS, currency="USD"),
        seen_digest=seen,
    )
    response = signed_in(reviewer).post(
        f"/reviews/{pending}/approve", {"action_digest": seen}, headers=HTMX
    )
    assert response.status_code == 200
    assert response["HX-Retarget"] == "#review"
    assert response["HX-Reswap"] == "outerHTML"
    page = parse(response)
    assert page.text("action-digest") == digest_of(pending)
    assert '"USD"' in page.text("version-diff")
    assert "The action changed after you opened it" in page.text("decision-message")
    assert state(page) == "pending"


def test_panel_poll_warns_when_a_newer_version_replaced_the_shown_one(
    reviewer: Any, second_reviewer: Any, pending: str
) -> None:
    seen = digest_of(pending)
    proposal_edit(
        occurrence=Occurrence.objects.get(pk=pending),
        editor=second_reviewer,
        arguments=dict(REFUND_ARGS, amount_minor=100),
        seen_digest=seen,
    )
    response = signed_in(reviewer).get(f"/reviews/{pending}/panel?shown={seen}", headers=HTMX)
    page = parse(response)
    assert "Version 2 has replaced version 1" in page.text("decision-panel")
    # The form still names what the page shows, so approving it is refused, never redirected
    # to a version the reviewer has not seen.
    values = [
        t.attrs["value"] for t in page.find_all("input") if t.attrs.get("name") == "action_digest"
    ]
    assert values == [seen]


def test_self_approval_is_refused_with_a_clear_message(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = propose(runtime, requested_by="rita")
    client = signed_in(reviewer)
    page = parse(client.get(f"/reviews/{occurrence_id}/"))
    assert "You are the requester" in page.text("approve-form")

    response = client.post(
        f"/reviews/{occurrence_id}/approve",
        {"action_digest": digest_of(occurrence_id)},
        headers=HTMX,
    )
    assert response.status_code == 200
    page = parse(response)
    assert state(page) == "pending"
    assert "You requested this action" in page.text("decision-message")

    response = client.post(
        f"/reviews/{occurrence_id}/approve", {"action_digest": digest_of(occurrence_id)}
    )
    assert response.status_code == 302
    page = parse(client.get(response["Location"]))
    assert "another reviewer must approve it" in page.text("decision-message")
    assert not ApprovalVote.objects.filter(proposal__occurrence_id=occurrence_id).exists()


def test_the_editor_of_a_version_is_told_and_refused(
    reviewer: Any, second_reviewer: Any, pending: str
) -> None:
    proposal_edit(
        occurrence=Occurrence.objects.get(pk=pending),
        editor=second_reviewer,
        arguments={**REFUND_ARGS, "payment_id": "pay_other"},
        seen_digest=digest_of(pending),
    )
    client = signed_in(second_reviewer)
    page = parse(client.get(f"/reviews/{pending}/"))
    assert "You wrote this version" in page.text("approve-form")

    response = client.post(
        f"/reviews/{pending}/approve", {"action_digest": digest_of(pending)}, headers=HTMX
    )
    page = parse(response)
    assert state(page) == "pending"
    assert "You edited this version" in page.text("decision-message")
    assert not Approval.objects.filter(occurrence_id=pending).exists()


def test_second_approver_who_lost_the_race_sees_the_issued_state(
    reviewer: Any, second_reviewer: Any, pending: str
) -> None:
    digest = digest_of(pending)
    # Both opened the page; rita's approval lands first.
    signed_in(reviewer).post(f"/reviews/{pending}/approve", {"action_digest": digest})
    response = signed_in(second_reviewer).post(
        f"/reviews/{pending}/approve", {"action_digest": digest}, headers=HTMX
    )
    assert response.status_code == 200
    page = parse(response)
    assert state(page) == "issued"
    assert "Another decision was recorded first" in page.text("decision-message")
    # Nothing went wrong for the loser: the news is told, not shown as an error.
    assert 'class="notice notice--info"' in page.source
    assert "notice--error" not in page.source
    assert Approval.objects.filter(occurrence_id=pending).count() == 1


def test_malformed_digest_is_a_bad_request(reviewer: Any, pending: str) -> None:
    client = signed_in(reviewer)
    assert client.post(f"/reviews/{pending}/approve", {}).status_code == 400
    assert client.post(f"/reviews/{pending}/approve", {"action_digest": "abc"}).status_code == 400
    assert Occurrence.objects.get(pk=pending).status == "pending_review"


# --- reject --------------------------------------------------------------------------


def test_reject_requires_a_reason(reviewer: Any, pending: str) -> None:
    client = signed_in(reviewer)
    response = client.post(f"/reviews/{pending}/reject", {"reason": "   "}, headers=HTMX)
    assert response.status_code == 422
    page = parse(response)
    assert state(page) == "pending"
    assert page.text("reject-error") == "Say why."
    assert page.attr("reject-reason", "aria-invalid") == "true"

    response = client.post(f"/reviews/{pending}/reject", {"reason": ""})
    assert response.status_code == 422
    assert parse(response).has("reject-error")
    assert Occurrence.objects.get(pk=pending).status == "pending_review"


def test_reject_shows_reason_and_who_rejected(reviewer: Any, pending: str) -> None:
    client = signed_in(reviewer)
    response = client.post(f"/reviews/{pending}/reject", {"reason": "Wrong customer."})
    assert response.status_code == 302
    page = parse(client.get(response["Location"]))
    assert state(page) == "rejected"
    assert "Wrong customer." in page.text("decision-panel")
    assert "by rita" in page.text("decision-panel")
    # A final state: the panel stops polling.
    assert page.attr("decision-panel", "hx-trigger") is None


def test_reject_after_approval_shows_the_issued_state(
    reviewer: Any, second_reviewer: Any, pending: str
) -> None:
    approve(pending, reviewer)
    response = signed_in(second_reviewer).post(
        f"/reviews/{pending}/reject", {"reason": "too late"}, headers=HTMX
    )
    page = parse(response)
    assert state(page) == "issued"
    assert "Another decision was recorded first" in page.text("decision-message")


# --- edit ----------------------------------------------------------------------------


def test_edit_creates_a_new_version_and_shows_the_diff(reviewer: Any, pending: str) -> None:
    client = signed_in(reviewer)
    old = digest_of(pending)
    arguments = json.dumps(dict(REFUND_ARGS, amount_minor=7000), indent=2)
    response = client.post(
        f"/reviews/{pending}/edit", {"arguments": arguments, "action_digest": old}
    )
    assert response.status_code == 302
    page = parse(client.get(response["Location"]))
    assert "Saved as version 2" in page.text("decision-message")
    assert page.text("action-digest") == digest_of(pending) != old
    diff = page.text("version-diff")
    assert "amount_minor" in diff and "7000" in diff and "8000" in diff
    assert "v1 → v2" in diff


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"payment_id": "a", "payment_id": "b"}', "appears twice"),
        (json.dumps(dict(REFUND_ARGS, amount_minor=80.5)), "amount_minor:"),
        (json.dumps(dict(REFUND_ARGS, extra=1)), "extra"),
        (json.dumps(REFUND_ARGS), "identical"),
        ("", "Enter the arguments"),
    ],
)
def test_edit_errors_are_shown_inline_and_keep_the_text(
    reviewer: Any, pending: str, arguments: str, message: str
) -> None:
    response = signed_in(reviewer).post(
        f"/reviews/{pending}/edit", {"arguments": arguments, "action_digest": digest_of(pending)}
    )
    assert response.status_code == 422
    page = parse(response)
    assert message in page.text("edit-errors")
    assert page.attr("edit-arguments", "aria-invalid") == "true"
    assert page.text("edit-arguments") == arguments
    assert Occurrence.objects.get(pk=pending).proposals.count() == 1


def test_edit_of_a_stale_version_keeps_the_text_and_shows_the_new_version(
    reviewer: Any, second_reviewer: Any, pending: str
) -> None:
    seen = digest_of(pending)
    proposal_edit(
        occurrence=Occurrence.objects.get(pk=pending),
        editor=second_reviewer,
        arguments=dict(REFUND_ARGS, amount_minor=100),
        seen_digest=seen,
    )
    mine = json.dumps(dict(REFUND_ARGS, amount_minor=200))
    response = signed_in(reviewer).post(
        f"/reviews/{pending}/edit", {"arguments": mine, "action_digest": seen}
    )
    assert response.status_code == 409
    page = parse(response)
    assert "changed while you were editing" in page.text("edit-errors")
    assert page.text("edit-arguments") == mine
    assert page.text("action-digest") == digest_of(pending)
    edit_digest = [
        t.attrs["value"] for t in page.find_all("input") if t.attrs.get("name") == "action_digest"
    ]
    assert digest_of(pending) in edit_digest
    assert Occurrence.objects.get(pk=pending).proposals.count() == 2


def test_edit_form_is_absent_once_the_request_is_decided(reviewer: Any, pending: str) -> None:
    client = signed_in(reviewer)
    response = client.post(f"/reviews/{pending}/reject", {"reason": "no"}, headers=HTMX)
    # The open page drops its edit form out of band.
    gone = parse(response).by_id["edit-section"]
    assert "hidden" in gone.attrs and gone.attrs["hx-swap-oob"] == "true"
    assert not parse(client.get(f"/reviews/{pending}/")).has("edit-form")
    response = client.post(
        f"/reviews/{pending}/edit",
        {
            "arguments": json.dumps(dict(REFUND_ARGS, amount_minor=1)),
            "action_digest": digest_of(pending),
        },
    )
    assert response.status_code == 409
    assert "can no longer be edited" in parse(response).text("decision-message")


# --- after approval: delivered, consumed, revoked, expired -------------------------------


def test_delivered_token_shows_its_fingerprint_never_the_token(
    reviewer: Any, runtime: Runtime, approved: str, token: str
) -> None:
    page = parse(signed_in(reviewer).get(f"/reviews/{approved}/"))
    assert state(page) == "delivered"
    fingerprint = Approval.objects.get(occurrence_id=approved).fingerprint
    assert fingerprint in page.text("decision-panel")
    assert fingerprint in page.text("history")
    assert token not in page.source
    assert "Expires in" in page.text("decision-panel")


def test_consumed_state_names_the_execution_command_and_key(
    reviewer: Any, runtime: Runtime, approved: str, token: str
) -> None:
    assert runtime.claim(token, "exec-42").status_code == 200
    page = parse(signed_in(reviewer).get(f"/reviews/{approved}/"))
    assert state(page) == "consumed"
    command = Occurrence.objects.get(pk=approved).commands.get()
    panel = page.text("decision-panel")
    assert "exec-42" in panel
    assert str(command.pk) in panel
    assert command.idempotency_key in panel
    assert "Not sent" in panel and "Queued: the console will deliver it" in panel
    assert token not in page.source


def test_admin_revokes_an_issued_approval(tenant: Tenant, approved: str) -> None:
    admin = make_user("ada", tenant, Membership.Role.ADMIN)
    client = signed_in(admin)
    response = client.post(f"/reviews/{approved}/revoke", {"reason": ""}, headers=HTMX)
    assert response.status_code == 422
    assert parse(response).text("revoke-error") == "Say why."

    response = client.post(
        f"/reviews/{approved}/revoke", {"reason": "Customer withdrew."}, headers=HTMX
    )
    page = parse(response)
    assert state(page) == "revoked"
    assert "Customer withdrew." in page.text("decision-panel")
    assert "by ada" in " ".join(page.text("decision-panel").split()).replace("Revoked by", "by")
    assert page.attr("decision-panel", "hx-trigger") is None
    assert Approval.objects.get(occurrence_id=approved).state == "revoked"

    # Revoking again changes nothing and says so.
    response = client.post(f"/reviews/{approved}/revoke", {"reason": "again"})
    assert response.status_code == 302
    assert "no issued approval" in parse(client.get(response["Location"])).text("decision-message")


def test_expired_approval_is_shown_expired_and_stops_polling(reviewer: Any, approved: str) -> None:
    past = timezone.now() - timedelta(hours=1)
    Approval.objects.filter(occurrence_id=approved).update(
        issued_at=past - timedelta(minutes=15), expires_at=past
    )
    page = parse(signed_in(reviewer).get(f"/reviews/{approved}/"))
    assert state(page) == "expired"
    assert "expired at" in page.text("decision-panel")
    assert page.attr("decision-panel", "hx-trigger") is None


def test_auto_admitted_call_needs_no_decision(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = propose(runtime, tool="lookup_order", arguments={"order_id": "1042"})
    page = parse(signed_in(reviewer).get(f"/reviews/{occurrence_id}/"))
    assert state(page) == "auto_admitted"
    assert not page.has("approve-form")
    assert "Admitted by policy" in page.text("decision-panel")


# --- polling -----------------------------------------------------------------------


def test_panel_poll_answers_204_until_something_changes(
    reviewer: Any, second_reviewer: Any, pending: str
) -> None:
    client = signed_in(reviewer)
    page = parse(client.get(f"/reviews/{pending}/"))
    poll = str(page.attr("decision-panel", "hx-get"))
    assert re.search(r"[?&]rendered=[0-9a-f]{16}", poll)

    assert client.get(poll, headers=HTMX).status_code == 204
    approve(pending, second_reviewer)
    response = client.get(poll, headers=HTMX)
    assert response.status_code == 200
    assert state(parse(response)) == "issued"


def test_a_reload_a_second_tab_and_a_second_reviewer_see_the_same_state(
    reviewer: Any, second_reviewer: Any, pending: str
) -> None:
    signed_in(reviewer).post(f"/reviews/{pending}/approve", {"action_digest": digest_of(pending)})
    views = [
        signed_in(reviewer).get(f"/reviews/{pending}/"),
        signed_in(reviewer).get(f"/reviews/{pending}/panel"),
        signed_in(second_reviewer).get(f"/reviews/{pending}/"),
    ]
    assert {state(parse(v)) for v in views} == {"issued"}


def test_get_requests_change_nothing(reviewer: Any, pending: str) -> None:
    client = signed_in(reviewer)
    before = Occurrence.objects.get(pk=pending).updated_at
    for url in (
        "/reviews/",
        f"/reviews/{pending}/",
        f"/reviews/{pending}/panel",
        f"/reviews/{pending}/?since=" + "0" * 64,
    ):
        client.get(url)
    assert Occurrence.objects.get(pk=pending).updated_at == before
    assert not ApprovalVote.objects.exists()


# --- what a poll notices ----------------------------------------------------------------

# Session, user, memberships, and the one query that reads the stamp.
UNCHANGED_PANEL_POLL_QUERIES = 4


def poll_url(client: Any, occurrence_id: str) -> str:
    url = parse(client.get(f"/reviews/{occurrence_id}/")).attr("decision-panel", "hx-get")
    assert url, "the panel should poll in this state"
    return str(url)


def _proposed(runtime: Runtime, arguments: dict[str, Any] | None = None) -> str:
    return propose(runtime, arguments=arguments or dict(REFUND_ARGS))


def _issued(runtime: Runtime, approver: Any) -> str:
    occurrence_id = _proposed(runtime)
    assert approve(occurrence_id, approver).issued
    return occurrence_id


def _delivered(runtime: Runtime, approver: Any) -> tuple[str, str]:
    occurrence_id = _issued(runtime, approver)
    return occurrence_id, runtime.token(occurrence_id).json()["token"]


def _edit(occurrence_id: str, editor: Any) -> None:
    proposal_edit(
        occurrence=Occurrence.objects.get(pk=occurrence_id),
        editor=editor,
        arguments=dict(REFUND_ARGS, amount_minor=7000),
        seen_digest=digest_of(occurrence_id),
    )


@pytest.mark.parametrize(
    "change",
    [
        "vote",
        "approval issued",
        "rejected",
        "edited while pending",
        "token delivered",
        "claimed",
        "command state",
        "revoked",
        "edited while issued",
        "reviewer added",
    ],
)
def test_every_change_a_reviewer_must_see_ends_the_204s(
    runtime: Runtime,
    reviewer: Any,
    second_reviewer: Any,
    tenant: Tenant,
    change: str,
    django_assert_max_num_queries: Any,
) -> None:
    """Each state change alters the stamp the poll compares, whether or not it writes an
    audit event or touches the occurrence's updated_at."""
    watcher = make_user("wanda", tenant, Membership.Role.REVIEWER, Membership.Role.ADMIN)
    token = ""
    if change in {"vote", "reviewer added"}:
        occurrence_id = _proposed(runtime, BIG_REFUND)
    elif change in {"approval issued", "rejected", "edited while pending"}:
        occurrence_id = _proposed(runtime)
    elif change == "token delivered":
        occurrence_id = _issued(runtime, reviewer)
    elif change == "command state":
        occurrence_id, token = _delivered(runtime, reviewer)
        assert runtime.claim(token, "exec-1").status_code == 200
    else:
        occurrence_id, token = _delivered(runtime, reviewer)

    client = signed_in(watcher)
    poll = poll_url(client, occurrence_id)
    with django_assert_max_num_queries(UNCHANGED_PANEL_POLL_QUERIES):
        assert client.get(poll, headers=HTMX).status_code == 204

    occurrence = Occurrence.objects.get(pk=occurrence_id)
    expected = None
    if change == "vote":
        approve(occurrence_id, reviewer)
        expected = "awaiting_quorum"
    elif change == "approval issued":
        approve(occurrence_id, reviewer)
        expected = "issued"
    elif change == "rejected":
        occurrence_reject(occurrence=occurrence, reviewer=reviewer, reason="no")
        expected = "rejected"
    elif change in {"edited while pending", "edited while issued"}:
        _edit(occurrence_id, second_reviewer)
        expected = "pending"
    elif change == "token delivered":
        assert runtime.token(occurrence_id).status_code == 200
        expected = "delivered"
    elif change == "claimed":
        assert runtime.claim(token, "exec-1").status_code == 200
        expected = "consumed"
    elif change == "command state":
        # As a worker writes it: no audit event, and the occurrence is left alone.
        Command.objects.filter(occurrence_id=occurrence_id).update(state=Command.State.COMMITTED)
        expected = "consumed"
    elif change == "revoked":
        approval_revoke(
            approval=Approval.objects.get(occurrence_id=occurrence_id), admin=watcher, reason="r"
        )
        expected = "revoked"
    elif change == "reviewer added":
        make_user("newton", tenant, Membership.Role.REVIEWER)
        expected = "pending"

    response = client.get(poll, headers=HTMX)
    assert response.status_code == 200
    page = parse(response)
    assert state(page) == expected
    panel = " ".join(page.text("decision-panel").split())
    if change == "command state":
        assert "Committed" in panel
    if change.startswith("edited"):
        assert "Version 2 has replaced version 1" in panel
    if change == "reviewer added":
        assert "newton" in panel
    # The new answer carries a new stamp, which the next poll finds unchanged.
    again = page.attr("decision-panel", "hx-get")
    if again:
        assert client.get(str(again), headers=HTMX).status_code == 204


def test_the_clock_changes_the_poll_answer_of_an_issued_approval(
    runtime: Runtime, reviewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    occurrence_id = _issued(runtime, reviewer)
    client = signed_in(reviewer)
    poll = poll_url(client, occurrence_id)
    assert client.get(poll, headers=HTMX).status_code == 204

    real_now = timezone.now
    # Nothing is written when a minute passes or an approval runs out: only the clock moves.
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(minutes=2))
    response = client.get(poll, headers=HTMX)
    assert response.status_code == 200
    assert state(parse(response)) == "issued"
    assert "Expires in 12 minutes" in " ".join(parse(response).text("decision-panel").split())

    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(minutes=16))
    response = client.get(poll, headers=HTMX)
    assert response.status_code == 200
    assert state(parse(response)) == "expired"


def test_unchanged_poll_of_a_long_history_costs_the_same_few_queries(
    runtime: Runtime, reviewer: Any, django_assert_max_num_queries: Any
) -> None:
    occurrence_id = _issued(runtime, reviewer)
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    AuditEvent.objects.bulk_create(
        AuditEvent(
            kind="claim.scope_mismatch",
            tenant_id=occurrence.tenant_id,
            occurrence=occurrence,
            decision="scope_mismatch",
            execution_id=f"retry-{n}",
            source_time=timezone.now(),
        )
        for n in range(300)
    )
    client = signed_in(reviewer)
    poll = poll_url(client, occurrence_id)
    with django_assert_max_num_queries(UNCHANGED_PANEL_POLL_QUERIES):
        assert client.get(poll, headers=HTMX).status_code == 204
    audit_record(kind="claim.scope_mismatch", tenant=occurrence.tenant_id, occurrence=occurrence)
    assert client.get(poll, headers=HTMX).status_code == 200


def test_another_tenants_stamp_is_still_a_404(
    runtime: Runtime, other_runtime: Runtime, reviewer: Any
) -> None:
    foreign = propose(other_runtime)
    response = signed_in(reviewer).get(f"/reviews/{foreign}/panel?rendered=0", headers=HTMX)
    assert response.status_code == 404


# --- the edit form stays out of the way ---------------------------------------------------


def _edit_details(page: Html) -> Any:
    (details,) = page.find_all("details")
    return details


def test_edit_form_is_there_but_closed_until_asked_for(reviewer: Any, pending: str) -> None:
    page = parse(signed_in(reviewer).get(f"/reviews/{pending}/"))
    assert page.has("edit-form") and page.has("edit-arguments")
    assert "open" not in _edit_details(page).attrs
    assert "Edit arguments…" in page.text("edit-section")


def test_edit_form_opens_on_its_own_errors(reviewer: Any, pending: str) -> None:
    response = signed_in(reviewer).post(
        f"/reviews/{pending}/edit", {"arguments": "{not json", "action_digest": digest_of(pending)}
    )
    assert response.status_code == 422
    assert "open" in _edit_details(parse(response)).attrs
