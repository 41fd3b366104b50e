"""A consumed approval says what its effect came to, beside the decision, on the review page
and in the inbox; and a reviewer can list the approvals they gave that went wrong."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.audit.record import audit_record
from approvals.models import Command, Occurrence
from approvals.vocabulary import AuditKind
from approvals.web.selectors import inbox
from approvals.web.selectors.inbox import InboxQuery
from tests.approvals.test_views_html import Html, parse, propose, signed_in
from tests.approvals.test_views_inbox import row_ids
from tests.conftest import REFUND_ARGS, Runtime, approve


def consumed(runtime: Runtime, reviewer: Any, payment: str, state: str = "") -> str:
    """An occurrence approved by ``reviewer``, claimed, its command moved to ``state``."""
    occurrence_id = propose(runtime, arguments=dict(REFUND_ARGS, payment_id=payment))
    approve(occurrence_id, reviewer)
    token = runtime.token(occurrence_id).json()["token"]
    claimed = runtime.claim(
        token, f"exec-{payment}", arguments=dict(REFUND_ARGS, payment_id=payment)
    )
    assert claimed.json()["decision"] == "approved", claimed.content
    if state:
        Command.objects.filter(occurrence_id=occurrence_id).update(state=state)
    return occurrence_id


def interrupt(occurrence_id: str) -> None:
    command = Command.objects.get(occurrence_id=occurrence_id)
    Command.objects.filter(pk=command.pk).update(state=Command.State.REJECTED)
    audit_record(
        kind=AuditKind.RECOVERY_INTERRUPTED,
        tenant=command.tenant_id,
        occurrence=command.occurrence_id,
        command_id=command.pk,
        data={"challenges": ["Bearer realm=pay"]},
    )


def badge_of(page: Html, occurrence_id: str) -> tuple[str, str]:
    """A row's state badge: its modifier and its words."""
    found = re.search(
        rf'data-occurrence-id="{occurrence_id}".*?<td class="cell-state">'
        r'<span class="badge badge--([\w-]+)">([^<]*)</span>',
        page.source,
    )
    assert found, occurrence_id
    return found[1], html.unescape(found[2])


def badge(page: Html, occurrence_id: str) -> str:
    return badge_of(page, occurrence_id)[1]


def words(text: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


@pytest.mark.parametrize(
    ("state", "word"),
    [
        (Command.State.COMMITTED, "committed"),
        (Command.State.REJECTED, "rejected"),
        (Command.State.OUTCOME_UNKNOWN, "outcome unknown"),
        (Command.State.PENDING, "not sent"),
    ],
)
def test_the_review_header_says_the_effect_beside_consumed(
    runtime: Runtime, reviewer: Any, state: str, word: str
) -> None:
    occurrence_id = consumed(runtime, reviewer, "pay_h", state)
    page = parse(signed_in(reviewer).get(f"/reviews/{occurrence_id}/"))
    assert page.text("occurrence-status").strip() == f"Consumed · {word}"


def test_an_interrupted_effect_is_named_so_in_the_header_and_the_inbox(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = consumed(runtime, reviewer, "pay_i")
    interrupt(occurrence_id)
    client = signed_in(reviewer)
    page = parse(client.get(f"/reviews/{occurrence_id}/"))
    assert page.text("occurrence-status").strip() == "Consumed · interrupted"
    listing = parse(client.get("/reviews/?state=consumed"))
    assert badge(listing, occurrence_id) == "Consumed · interrupted"


def test_the_consumed_list_gives_each_rows_effect(runtime: Runtime, reviewer: Any) -> None:
    ok = consumed(runtime, reviewer, "pay_ok", Command.State.COMMITTED)
    unknown = consumed(runtime, reviewer, "pay_unk", Command.State.OUTCOME_UNKNOWN)
    waiting = consumed(runtime, reviewer, "pay_wait")
    page = parse(signed_in(reviewer).get("/reviews/?state=claimed"))
    assert badge(page, ok) == "Consumed · committed"
    assert badge(page, unknown) == "Consumed · outcome unknown"
    assert badge(page, waiting) == "Consumed · not sent"
    assert badge_of(page, unknown)[0] == "command-outcome_unknown"
    assert badge_of(page, ok)[0] == "command-committed"


def test_my_approvals_that_went_wrong_lists_only_mine_that_failed(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    ok = consumed(runtime, reviewer, "pay_ok", Command.State.COMMITTED)
    unknown = consumed(runtime, reviewer, "pay_unk", Command.State.OUTCOME_UNKNOWN)
    failed = consumed(runtime, reviewer, "pay_fail", Command.State.REJECTED)
    interrupted = consumed(runtime, reviewer, "pay_int")
    interrupt(interrupted)
    theirs = consumed(runtime, second_reviewer, "pay_theirs", Command.State.OUTCOME_UNKNOWN)
    pending = propose(runtime, arguments=dict(REFUND_ARGS, payment_id="pay_pending"))

    page = parse(signed_in(reviewer).get("/reviews/?state=went_wrong"))
    listed = set(row_ids(page))
    assert listed == {unknown, failed, interrupted}
    assert not listed & {ok, theirs, pending}
    assert "3 of my approvals went wrong" in words(page.source)
    # The other reviewer's list holds theirs alone.
    assert row_ids(parse(signed_in(second_reviewer).get("/reviews/?state=went_wrong"))) == [theirs]


def test_the_inbox_links_to_the_went_wrong_list_and_says_when_it_is_empty(
    runtime: Runtime, reviewer: Any
) -> None:
    client = signed_in(reviewer)
    page = parse(client.get("/reviews/"))
    assert page.attr("went-wrong-link", "href") == "/reviews/?state=went_wrong"
    consumed(runtime, reviewer, "pay_ok", Command.State.COMMITTED)
    text = words(parse(client.get("/reviews/?state=went_wrong")).source)
    assert "None of your approvals went wrong." in text


def test_the_went_wrong_list_and_the_consumed_list_keep_their_query_count(
    runtime: Runtime, reviewer: Any
) -> None:
    client = signed_in(reviewer)

    def count(url: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url).status_code == 200
        return len(captured.captured_queries)

    consumed(runtime, reviewer, "pay_0", Command.State.OUTCOME_UNKNOWN)
    few = {url: count(url) for url in ("/reviews/?state=went_wrong", "/reviews/?state=claimed")}
    for n in range(1, 6):
        occurrence_id = consumed(runtime, reviewer, f"pay_{n}", Command.State.REJECTED)
        if n % 2:
            interrupt(occurrence_id)
    for url, queries in few.items():
        assert count(url) == queries, url


def test_the_effect_reads_answer_as_their_orm_twins(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    consumed(runtime, reviewer, "pay_ok", Command.State.COMMITTED)
    consumed(runtime, reviewer, "pay_unk", Command.State.OUTCOME_UNKNOWN)
    interrupt(consumed(runtime, second_reviewer, "pay_int"))
    propose(runtime, arguments=dict(REFUND_ARGS, payment_id="pay_pending"))
    tenant = [runtime.key.tenant_id]
    queries = [
        InboxQuery(tenant),
        InboxQuery(tenant, status=Occurrence.Status.CLAIMED),
        InboxQuery(tenant, status=Occurrence.Status.CLAIMED, went_wrong_for=reviewer.pk),
        InboxQuery(tenant, status=Occurrence.Status.CLAIMED, went_wrong_for=second_reviewer.pk),
    ]

    def read(query: InboxQuery) -> Any:
        page, _, approvals = inbox._page_rows(query, 0, 25)
        return (
            inbox.inbox_total(query).total,
            [o.pk for o in page],
            sorted((str(a.pk), a.command_state, a.interrupted) for a in approvals),  # type: ignore[attr-defined]
        )

    for query in queries:
        sql = read(query)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(inbox, "on_postgresql", lambda: False)
            orm = read(query)
        assert sql == orm, query
    went_wrong = read(queries[2])
    assert went_wrong[0] == 1
    interrupted = read(queries[3])[2]
    assert [(state, flag) for _, state, flag in interrupted] == [("rejected", True)]
