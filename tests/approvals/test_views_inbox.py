"""The inbox: what it lists, its filters, paging, polling and the tenant switcher; signing
in and out."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.safestring import SafeString

from approvals.models import Membership, Occurrence, Tenant
from approvals.reviews.decisions import occurrence_reject
from approvals.reviews.proposals import occurrence_propose
from approvals.reviews.selectors import inbox_tools
from approvals.web.jinja import render_rows
from approvals.web.presenters import inbox as inbox_presenters
from approvals.web.selectors.inbox import InboxQuery, inbox_page
from approvals.web.text import ArgumentFlag
from tests.approvals.test_views_html import Html, parse, propose, signed_in
from tests.conftest import PASSWORD, REFUND_ARGS, Runtime, approve, make_user

HTMX = {"HX-Request": "true"}


def row_ids(page: Html) -> list[str]:
    return [
        str(t.attrs["data-occurrence-id"])
        for t in page.find_all("tr")
        if "data-occurrence-id" in t.attrs
    ]


def propose_many(runtime: Runtime, count: int, **fields: Any) -> list[str]:
    """``count`` occurrences through the service (the API would be slower), oldest first."""
    ids = []
    for n in range(count):
        occurrence, _ = occurrence_propose(
            runtime_key=runtime.key,
            tool=fields.get("tool", "issue_refund"),
            arguments=fields.get("arguments", dict(REFUND_ARGS, payment_id=f"pay_{n}")),
            run_id=f"run-{n}",
            reason="bulk",
            requested_by="agent",
        )
        ids.append(str(occurrence.pk))
    return ids


def test_root_redirects_to_the_inbox(reviewer: Any) -> None:
    response = signed_in(reviewer).get("/")
    assert response.status_code == 302
    assert response["Location"] == "/reviews/"


def test_sign_in_with_the_standard_form_lands_in_the_inbox(reviewer: Any) -> None:
    client = Client()
    page = parse(client.get("/accounts/login/"))
    assert page.has("id_username") and page.has("id_password")
    response = client.post("/accounts/login/", {"username": "rita", "password": PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == "/reviews/"
    assert client.get("/reviews/").status_code == 200


def test_sign_out_is_a_post_form(reviewer: Any) -> None:
    client = signed_in(reviewer)
    page = parse(client.get("/reviews/"))
    assert page.find_all("form", action="/accounts/logout/", method="post")
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/reviews/").status_code == 302


def test_inbox_lists_pending_requests_newest_first_with_a_count(
    runtime: Runtime, reviewer: Any
) -> None:
    ids = propose_many(runtime, 3)
    approve(ids[0], reviewer)
    page = parse(signed_in(reviewer).get("/reviews/"))
    assert page.text("inbox-count") == "2"
    assert row_ids(page) == [ids[2], ids[1]]
    for occurrence_id in ids[1:]:
        assert page.find_all("a", href=f"/reviews/{occurrence_id}/")


def test_inbox_row_shows_tool_summary_requester_run_state_and_age(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(runtime, requested_by="alice", run_id="run-support-7")
    response = signed_in(reviewer).get("/reviews/")
    html = response.content.decode()
    row = html[html.index(f'data-occurrence-id="{occurrence_id}"') :]
    row = row[: row.index("</tr>")]
    for text in (
        "issue_refund",
        "amount_minor=8000",
        "alice",
        "run-support-7",
        "Pending review",
        "just now",
    ):
        assert text in row, text


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("pending_review", {"pending"}),
        ("approved", {"approved"}),
        ("rejected", {"rejected"}),
        ("auto_admitted", {"lookup"}),
        ("claimed", set()),
        ("revoked", set()),
        ("all", {"pending", "approved", "rejected", "lookup"}),
        ("nonsense", {"pending"}),
    ],
)
def test_state_filter(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, state: str, expected: set[str]
) -> None:
    named = {
        "pending": propose(runtime),
        "approved": propose(runtime, arguments=dict(REFUND_ARGS, payment_id="a")),
        "rejected": propose(runtime, arguments=dict(REFUND_ARGS, payment_id="r")),
        "lookup": propose(runtime, tool="lookup_order", arguments={"order_id": "1"}),
    }
    approve(named["approved"], reviewer)
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=named["rejected"]), reviewer=reviewer, reason="no"
    )
    page = parse(signed_in(second_reviewer).get(f"/reviews/?state={state}"))
    assert set(row_ids(page)) == {named[n] for n in expected}
    assert page.text("inbox-count") == str(len(expected))


def test_tool_filter_and_the_filter_form(runtime: Runtime, reviewer: Any) -> None:
    refund = propose(runtime)
    message = propose(
        runtime, tool="send_message", arguments={"to": "a@b.c", "subject": "s", "body": "b"}
    )
    page = parse(signed_in(reviewer).get("/reviews/?tool=send_message"))
    assert row_ids(page) == [message]
    assert refund not in row_ids(page)
    form = page.by_id["inbox-filters"]
    assert form.tag == "form"
    names = {t.attrs.get("name") for t in page.find_all("select")}
    assert {"tool", "state"} <= names
    selected = [t for t in page.find_all("option") if "selected" in t.attrs]
    assert {t.attrs["value"] for t in selected} == {"send_message", "pending_review"}


def test_a_bad_page_number_keeps_the_tool_filter(runtime: Runtime, reviewer: Any) -> None:
    propose(runtime)
    message = propose(
        runtime, tool="send_message", arguments={"to": "a@b.c", "subject": "s", "body": "b"}
    )
    page = parse(signed_in(reviewer).get("/reviews/?tool=send_message&page=abc"))
    assert row_ids(page) == [message]


def test_inbox_pages_25_rows(runtime: Runtime, reviewer: Any) -> None:
    ids = propose_many(runtime, 30)
    client = signed_in(reviewer)
    first = parse(client.get("/reviews/"))
    assert first.text("inbox-count") == "30"
    assert row_ids(first) == list(reversed(ids))[:25]
    second = parse(client.get("/reviews/?page=2"))
    assert row_ids(second) == list(reversed(ids))[25:]
    assert parse(client.get("/reviews/?page=99")).text("inbox-count") == "30"


def test_htmx_gets_the_list_partial_which_polls_with_its_filters(
    runtime: Runtime, reviewer: Any
) -> None:
    propose(runtime)
    client = signed_in(reviewer)
    response = client.get("/reviews/?tool=issue_refund&state=all", headers=HTMX)
    assert response.status_code == 200
    assert "<html" not in response.content.decode()
    page = parse(response)
    poll = str(page.attr("inbox-list", "hx-get"))
    assert page.attr("inbox-list", "hx-trigger") == "every 5s"
    assert "tool=issue_refund" in poll and "state=all" in poll and "page=1" in poll
    # Nothing changed: no content, so htmx swaps nothing and keeps focus and scroll.
    assert client.get(poll, headers=HTMX).status_code == 204
    new = propose(runtime, arguments=dict(REFUND_ARGS, payment_id="new"))
    response = client.get(poll, headers=HTMX)
    assert response.status_code == 200
    assert new in row_ids(parse(response))


def test_history_restore_gets_the_whole_page(reviewer: Any) -> None:
    response = signed_in(reviewer).get(
        "/reviews/", headers={**HTMX, "HX-History-Restore-Request": "true"}
    )
    assert "<html" in response.content.decode()


def test_person_without_a_reviewer_role_gets_an_explanation(tenant: Tenant) -> None:
    operator = make_user("olga", tenant, Membership.Role.OPERATOR)
    response = signed_in(operator).get("/reviews/")
    assert response.status_code == 200
    assert "not a reviewer or admin of any tenant" in response.content.decode()


# --- several tenants -------------------------------------------------------------------


@pytest.fixture
def two_tenant_reviewer(tenant: Tenant, other_tenant: Tenant) -> Any:
    user = make_user("tess", tenant, Membership.Role.REVIEWER)
    Membership.objects.create(user=user, tenant=other_tenant, role=Membership.Role.REVIEWER)
    return user


def test_tenant_switcher_scopes_the_inbox(
    runtime: Runtime, other_runtime: Runtime, two_tenant_reviewer: Any, tenant: Tenant
) -> None:
    acme = propose(runtime)
    globex = propose(other_runtime)
    client = signed_in(two_tenant_reviewer)

    page = parse(client.get("/reviews/"))
    assert set(row_ids(page)) == {acme, globex}
    options = {
        str(t.attrs["value"])
        for t in page.find_all("option")
        if t.attrs.get("value") in {"", "acme", "globex"}
    }
    assert options == {"", "acme", "globex"}
    assert "All my tenants" in page.source

    response = client.post("/tenant/", {"tenant": "acme", "next": "/reviews/?state=all"})
    assert response.status_code == 302
    assert response["Location"] == "/reviews/?state=all"
    page = parse(client.get("/reviews/"))
    assert row_ids(page) == [acme]
    # Another tenant's request stays reachable from its link: the switcher scopes the inbox.
    assert client.get(f"/reviews/{globex}/").status_code == 200

    client.post("/tenant/", {"tenant": ""})
    assert set(row_ids(parse(client.get("/reviews/")))) == {acme, globex}


def test_tenant_switcher_ignores_foreign_tenants_and_unsafe_next(
    runtime: Runtime, reviewer: Any, other_tenant: Tenant
) -> None:
    client = signed_in(reviewer)
    response = client.post("/tenant/", {"tenant": "globex", "next": "https://evil.example/"})
    assert response["Location"] == "/reviews/"
    assert "console_tenant" not in client.session


def test_one_tenant_shows_no_switcher(reviewer: Any) -> None:
    page = parse(signed_in(reviewer).get("/reviews/"))
    assert not page.has("tenant-select")


# --- what a row says about votes and tokens, and the poll that notices ---------------------

BIG_REFUND = dict(REFUND_ARGS, amount_minor=129900)  # above the quorum threshold: 2 approvers


def _badge(page: Html, occurrence_id: str) -> tuple[str, str]:
    """A row's badge: its class modifier and its text."""
    row = page.source[page.source.index(f'data-occurrence-id="{occurrence_id}"') :]
    row = row[: row.index("</tr>")]
    found = re.search(r'<span class="badge badge--([\w-]+)">([^<]*)</span>', row)
    assert found is not None, row
    return found.group(1), found.group(2)


def test_a_refund_with_one_of_two_approvals_says_so(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    big = propose(runtime, arguments=BIG_REFUND)
    small = propose(runtime, arguments=dict(REFUND_ARGS, payment_id="small"))
    untouched = propose(runtime, arguments=dict(BIG_REFUND, payment_id="untouched"))
    approve(big, reviewer)
    approve(small, reviewer)
    client = signed_in(second_reviewer)
    page = parse(client.get("/reviews/"))
    assert _badge(page, big) == ("awaiting_quorum", "1 of 2 approvals")
    assert _badge(page, untouched) == ("pending", "Pending review")
    assert small not in row_ids(page)  # one approval was enough: it left the pending list


def test_a_vote_ends_the_inbox_polls_204s(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    big = propose(runtime, arguments=BIG_REFUND)
    client = signed_in(second_reviewer)
    poll = str(parse(client.get("/reviews/")).attr("inbox-list", "hx-get"))
    assert client.get(poll, headers=HTMX).status_code == 204
    # A vote leaves the occurrence as it was (still pending, same updated_at).
    approve(big, reviewer)
    response = client.get(poll, headers=HTMX)
    assert response.status_code == 200
    assert _badge(parse(response), big) == ("awaiting_quorum", "1 of 2 approvals")


def test_a_token_delivery_ends_the_inbox_polls_204s(
    runtime: Runtime, reviewer: Any, approved: str
) -> None:
    client = signed_in(reviewer)
    poll = str(parse(client.get("/reviews/?state=approved")).attr("inbox-list", "hx-get"))
    assert client.get(poll, headers=HTMX).status_code == 204
    assert runtime.token(approved).status_code == 200
    response = client.get(poll, headers=HTMX)
    assert response.status_code == 200
    assert _badge(parse(response), approved) == ("delivered", "Token delivered")


def test_a_request_leaving_the_list_ends_the_inbox_polls_204s(
    runtime: Runtime, reviewer: Any
) -> None:
    ids = propose_many(runtime, 2)
    client = signed_in(reviewer)
    poll = str(parse(client.get("/reviews/")).attr("inbox-list", "hx-get"))
    assert client.get(poll, headers=HTMX).status_code == 204
    occurrence_reject(occurrence=Occurrence.objects.get(pk=ids[0]), reviewer=reviewer, reason="no")
    response = client.get(poll, headers=HTMX)
    assert response.status_code == 200
    assert row_ids(parse(response)) == [ids[1]]


def test_a_claimed_request_is_consumed_on_every_page(runtime: Runtime, reviewer: Any) -> None:
    """One word per state: the API keeps its v1 value, every page says consumed."""
    occurrence_id = propose(runtime)
    approve(occurrence_id, reviewer)
    token = runtime.token(occurrence_id).json()["token"]
    assert runtime.claim(token, "exec-1").json()["decision"] == "approved"
    assert runtime.get(f"/api/v1/occurrences/{occurrence_id}").json()["status"] == "claimed"
    client = signed_in(reviewer)

    inbox = client.get("/reviews/?state=claimed").content.decode()
    review = client.get(f"/reviews/{occurrence_id}/").content.decode()

    # Beside the decision, its effect: nothing was sent yet (no worker ran here).
    assert re.search(r'class="badge badge--command-pending">Consumed · not sent<', inbox), inbox
    assert '<option value="claimed" selected>Consumed</option>' in inbox  # the filter
    assert "Claimed" not in inbox and "Claimed" not in review
    assert "Consumed" in review
    # The page's word filters too: the same list, the same option chosen.
    by_word = client.get("/reviews/?state=consumed").content.decode()
    assert '<option value="claimed" selected>Consumed</option>' in by_word
    assert re.search(r'class="badge badge--command-pending">Consumed · not sent<', by_word)
    assert "badge--pending" not in by_word


# --- the rows, rendered in Python (approvals/templatetags/rows.py) -----------------------


def test_inbox_rows_escape_what_the_agent_wrote_and_link_each_review(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence, _ = occurrence_propose(
        runtime_key=runtime.key,
        tool="issue_refund",
        arguments=dict(REFUND_ARGS, reason='<img src=x onerror="alert(1)">'),
        run_id="run-<b>7</b>",
        reason="bulk",
        requested_by='<script>alert("hi")</script>',
    )
    html = signed_in(reviewer).get("/reviews/").content.decode()
    row = html[html.index(f'<tr data-occurrence-id="{occurrence.pk}">') :]
    row = row[: row.index("</tr>")]
    assert "<script" not in row and "<img" not in row and "<b>" not in row
    assert "&lt;script&gt;alert(&quot;hi&quot;)&lt;/script&gt;" in row
    assert "run-&lt;b&gt;7&lt;/b&gt;" in row
    assert "&lt;img src=x onerror=" in row
    assert f'href="/reviews/{occurrence.pk}/"' in row
    assert f'id="review-link-{occurrence.pk}"' in row
    created = timezone.localtime(occurrence.created_at)
    assert f'<time datetime="{created.isoformat()}"' in row
    assert f"issue_refund from {created:%Y-%m-%d %H:%M}</span>" in row
    assert '<span class="muted">Amount</span> <strong>EUR 80.00</strong>' in row
    assert 'class="cell-tenant"' not in row  # one tenant: no tenant column


def test_a_reviewer_of_two_tenants_sees_each_rows_tenant_until_scoped(
    runtime: Runtime, other_runtime: Runtime, two_tenant_reviewer: Any, tenant: Tenant
) -> None:
    acme, globex = propose(runtime), propose(other_runtime)
    client = signed_in(two_tenant_reviewer)
    html = client.get("/reviews/").content.decode()
    for occurrence_id in (acme, globex):
        row = html[html.index(f'data-occurrence-id="{occurrence_id}"') :]
        name = Occurrence.objects.get(pk=occurrence_id).tenant.name
        assert f'<td class="cell-tenant">{name}</td>' in row[: row.index("</tr>")]
    client.post("/tenant/", {"tenant": tenant.slug})
    assert 'class="cell-tenant"' not in client.get("/reviews/").content.decode()


def test_a_path_flagged_twice_in_a_row_is_named_once(runtime: Runtime) -> None:
    occurrence_id = propose(runtime)
    [occurrence] = inbox_page(
        InboxQuery([runtime.key.tenant_id]),
        offset=0,
        limit=1,
        tools=inbox_tools(),
        tenants=[],
    )
    assert str(occurrence.pk) == occurrence_id
    row = inbox_presenters.inbox_row(occurrence, timezone.now())

    def flag(path: str) -> ArgumentFlag:
        return ArgumentFlag(
            path=SafeString(path), word=SafeString("w"), reads_as=SafeString("w"), reasons=[]
        )

    flagged = dataclasses.replace(row, flags=[flag("reason"), flag("reason"), flag("to")])

    def rendered(row: Any) -> str:
        context = {"rows": [row], "show_tenant": False}
        return render_rows("approvals/inbox_rows.html", context)

    html = rendered(flagged)
    assert "⚠ look-alike text in <code>reason</code>, <code>to</code></span>" in html
    assert "look-alike" not in rendered(row)


def test_an_inbox_pages_rows_share_their_tool_and_tenant(
    runtime: Runtime, tenant: Tenant, django_assert_num_queries: Any
) -> None:
    propose_many(runtime, 3)
    occurrences = InboxQuery(tenant_ids=[tenant.pk])
    tools = inbox_tools()
    with django_assert_num_queries(3):  # the ids and rows, the proposals, the approvals
        rows = inbox_page(occurrences, offset=0, limit=25, tools=tools, tenants=[tenant])
    assert len(rows) == 3
    assert all(row.tool is tools[row.tool_id] for row in rows)
    assert all(row.tenant is tenant for row in rows)
    # A tool contract added after the page read its tools is fetched, once, not missed.
    with django_assert_num_queries(4):
        rows = inbox_page(occurrences, offset=0, limit=25, tools={}, tenants=[])
    assert {row.tool.name for row in rows} == {"issue_refund"}
    assert rows[0].tool is rows[1].tool
