"""A page costs the same number of queries however many rows it shows."""

from __future__ import annotations

import html
import re
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.audit.record import audit_record
from approvals.models import (
    Channel,
    Command,
    NotificationDelivery,
    Occurrence,
    RoutingRuleVersion,
    RuntimeKey,
)
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from approvals.web.selectors.history import HISTORY_PAGE
from tests.approvals.test_routing import groups, refund, rules
from tests.approvals.test_views_html import Html, parse, propose, signed_in
from tests.approvals.test_views_inbox import propose_many, row_ids
from tests.conftest import Runtime, approve

__all__ = ["groups", "rules"]  # test_routing's groups and rules, as fixtures here


def queries_for(client: Any, url: str, **kwargs: Any) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, **kwargs)
    assert response.status_code == 200
    return len(captured.captured_queries)


def test_inbox_queries_do_not_grow_with_rows(
    runtime: Runtime, reviewer: Any, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(reviewer)
    ids = propose_many(runtime, 5)
    approve(ids[0], reviewer)
    few = queries_for(client, "/reviews/?state=all")

    more = propose_many(runtime, 45)
    for occurrence_id in more[:10]:
        approve(occurrence_id, reviewer)
    with django_assert_max_num_queries(few):
        response = client.get("/reviews/?state=all")
    assert response.status_code == 200
    assert len(row_ids(parse(response))) == 25
    with django_assert_max_num_queries(few):
        response = client.get("/reviews/?state=all", headers={"HX-Request": "true"})
    # The htmx answer is the table alone, with the same 25 rows: not a 204 or a redirect.
    assert response.status_code == 200
    assert "<html" not in response.content.decode()
    assert len(row_ids(parse(response))) == 25


def _grow_history(occurrence_id: str, events: int) -> None:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    for n in range(events):
        audit_record(
            kind="test.note",
            tenant=occurrence.tenant_id,
            occurrence=occurrence,
            actor=f"tester-{n}",
            data={"reason": f"note {n}"},
        )


def test_review_page_queries_do_not_grow_with_history(
    runtime: Runtime, reviewer: Any, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(reviewer)
    small = propose(runtime)  # one event: occurrence.proposed
    _grow_history(small, 1)
    assert Occurrence.objects.get(pk=small).audit_events.count() == 2
    few = queries_for(client, f"/reviews/{small}/")
    few_panel = queries_for(client, f"/reviews/{small}/panel", headers={"HX-Request": "true"})

    large = propose(runtime)
    _grow_history(large, 39)
    assert Occurrence.objects.get(pk=large).audit_events.count() == 40
    with django_assert_max_num_queries(few):
        response = client.get(f"/reviews/{large}/")
    assert response.status_code == 200
    assert parse(response).text("history").count("test.note") == 39
    with django_assert_max_num_queries(few_panel):
        response = client.get(f"/reviews/{large}/panel", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert parse(response).text("history").count("test.note") == 39


def test_review_page_queries_do_not_grow_with_versions_and_votes(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(second_reviewer)
    occurrence_id = propose(runtime)
    few = queries_for(client, f"/reviews/{occurrence_id}/")
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    for amount in range(100, 110):
        digest = occurrence.proposals.get(is_current=True).action_digest
        proposal_edit(
            occurrence=occurrence,
            editor=reviewer,
            arguments={"payment_id": "p", "amount_minor": amount, "currency": "EUR", "reason": "r"},
            seen_digest=digest,
        )
    with django_assert_max_num_queries(few):
        response = client.get(f"/reviews/{occurrence_id}/")
    assert response.status_code == 200
    assert "amount_minor" in response.content.decode()
    assert "109" in parse(response).text("decision-panel") or "109" in response.content.decode()


def test_review_page_shows_the_newest_window_and_counts_them_all(
    runtime: Runtime, reviewer: Any, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(reviewer)
    small = propose(runtime)
    few = queries_for(client, f"/reviews/{small}/")
    few_panel = queries_for(client, f"/reviews/{small}/panel", headers={"HX-Request": "true"})

    large = propose(runtime)
    _grow_history(large, 129)  # and occurrence.proposed: 130 events
    with django_assert_max_num_queries(few):
        response = client.get(f"/reviews/{large}/")
    assert response.status_code == 200
    page = parse(response)
    history = page.text("history")
    assert history.count("test.note") == HISTORY_PAGE == 50
    assert "latest 50 of 130 events, oldest first" in " ".join(history.split())
    # The newest, oldest first: note 79 to note 128; the proposal and notes 0-78 are older.
    assert notes_shown(page) == list(range(79, 129))
    assert "occurrence.proposed" not in history
    # The pager leads to the older events; there is nothing newer.
    assert history_links(page) == ["Oldest events", "← Earlier events"]

    with django_assert_max_num_queries(few_panel):
        response = client.get(f"/reviews/{large}/panel", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert parse(response).text("history").count("test.note") == 50


def history_links(page: Html) -> list[str]:
    """The history pager's link texts, in order."""
    if not page.has("history-pages"):
        return []
    nav = page.source[page.source.index('id="history-pages"') :]
    nav = nav[: nav.index("</nav>")]
    return [" ".join(text.split()) for text in re.findall(r"<a [^>]*>([^<]*)</a>", nav)]


def history_link(page: Html, text: str) -> str:
    """The URL of the history pager's link ``text``."""
    nav = page.source[page.source.index('id="history-pages"') :]
    nav = nav[: nav.index("</nav>")]
    for href, label in re.findall(r'<a [^>]*href="([^"]*)"[^>]*>([^<]*)</a>', nav):
        if label == text:
            return html.unescape(href)
    raise AssertionError(f"no {text!r} link in {history_links(page)}")


def notes_shown(page: Html) -> list[int]:
    """The numbers of the test notes a history window shows, in page order."""
    return [int(n) for n in re.findall(r"note (\d+)\b", page.text("history"))]


def test_history_pages_by_cursor_reach_every_event_once(
    runtime: Runtime, reviewer: Any, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(reviewer)
    occurrence_id = propose(runtime)
    _grow_history(occurrence_id, 129)  # notes 0-128 after occurrence.proposed: 130 events
    newest = queries_for(client, f"/reviews/{occurrence_id}/")

    # Earlier and earlier: each window is the 50 events before the first one shown.
    page = parse(client.get(f"/reviews/{occurrence_id}/"))
    assert notes_shown(page) == list(range(79, 129))
    url = history_link(page, "← Earlier events")
    assert "before=" in url and url.endswith("#history")
    with django_assert_max_num_queries(newest + 1):  # the window, and how many precede it
        response = client.get(url)
    assert response.status_code == 200
    page = parse(response)
    assert notes_shown(page) == list(range(29, 79))
    assert "events 31 to 80 of 130, oldest first" in " ".join(page.text("history").split())
    assert history_links(page) == ["← Earlier events", "Later events →"]

    # The end: the 30 events left, the proposal first, and no way further back.
    response = client.get(history_link(page, "← Earlier events"))
    assert response.status_code == 200
    page = parse(response)
    assert notes_shown(page) == list(range(29))
    assert "occurrence.proposed" in page.text("history")
    assert "events 1 to 30 of 130, oldest first" in " ".join(page.text("history").split())
    assert history_links(page) == ["Later events →", "Latest events"]

    # And forward again through the next window's cursor, then to the newest.
    page = parse(client.get(history_link(page, "Later events →")))
    assert notes_shown(page) == list(range(29, 79))
    page = parse(client.get(history_link(page, "Later events →")))
    assert notes_shown(page) == list(range(79, 129))
    assert history_links(page) == ["Oldest events", "← Earlier events"]

    # The oldest window from anywhere; a cursor that is not an event id is the newest.
    page = parse(client.get(f"/reviews/{occurrence_id}/?after=0"))
    assert notes_shown(page) == list(range(49))
    assert "events 1 to 50 of 130" in " ".join(page.text("history").split())
    page = parse(client.get(f"/reviews/{occurrence_id}/?before=x1"))
    assert notes_shown(page) == list(range(79, 129))


def test_an_older_window_keeps_its_place_when_the_panel_polls(
    runtime: Runtime, reviewer: Any
) -> None:
    client = signed_in(reviewer)
    occurrence_id = propose(runtime)  # pending: the panel polls
    _grow_history(occurrence_id, 129)
    newest = parse(client.get(f"/reviews/{occurrence_id}/"))
    page = parse(client.get(history_link(newest, "← Earlier events")))
    poll = str(page.attr("decision-panel", "hx-get"))
    assert "before=" in poll
    _grow_history(occurrence_id, 1)  # a change: the poll answers with the panel and history
    response = client.get(poll, headers={"HX-Request": "true"})
    assert response.status_code == 200
    polled = parse(response)
    assert polled.attr("history", "hx-swap-oob") == "true"
    assert notes_shown(polled) == list(range(29, 79))
    assert "events 31 to 80 of 131" in " ".join(polled.text("history").split())


def test_a_short_history_says_how_many_events_it_has(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = propose(runtime)
    _grow_history(occurrence_id, 2)
    history = " ".join(
        parse(signed_in(reviewer).get(f"/reviews/{occurrence_id}/")).text("history").split()
    )
    assert "History 3 events, oldest first" in history
    assert "latest" not in history


def test_rejecter_is_named_when_the_rejection_is_older_than_the_shown_events(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason="no"
    )
    _grow_history(occurrence_id, 210)
    page = parse(signed_in(reviewer).get(f"/reviews/{occurrence_id}/"))
    assert "occurrence.rejected" not in page.text("history")
    assert "Rejected by rita" in " ".join(page.text("decision-panel").split())


def test_review_page_reads_the_runtime_key_with_the_occurrence(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    with CaptureQueriesContext(connection) as captured:
        response = signed_in(reviewer).get(f"/reviews/{occurrence_id}/")
    assert runtime.key.name in response.content.decode()
    key_table = RuntimeKey._meta.db_table
    alone = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT")]
    assert not [sql for sql in alone if re.search(rf'FROM "?{key_table}"?', sql)]


def test_tool_filter_counts_on_the_tool_id_without_a_join(runtime: Runtime, reviewer: Any) -> None:
    propose_many(runtime, 3)
    propose_many(
        runtime, 2, tool="send_message", arguments={"to": "a@b.c", "subject": "s", "body": "b"}
    )
    with CaptureQueriesContext(connection) as captured:
        page = parse(signed_in(reviewer).get("/reviews/?tool=send_message"))
    assert page.text("inbox-count") == "2"
    table = Occurrence._meta.db_table
    counts = [
        q["sql"]
        for q in captured.captured_queries
        if "COUNT(" in q["sql"] and re.search(rf'FROM "?{table}"?', q["sql"])
    ]
    assert counts and all("tool_id" in sql for sql in counts)
    # The occurrences are joined to nothing (the routing read beside the count, in the
    # same statement, joins its own tables before them).
    occurrences = [re.split(rf'FROM "?{table}"?', sql, maxsplit=1)[1] for sql in counts]
    assert not [sql for sql in occurrences if "JOIN" in sql]


# Session, user, memberships (with the header's unread count), tool ids, the list's count
# and change time (with the rule versions that route to the reader: the page's order
# depends on them), and the newest event of the rows on the page.
UNCHANGED_INBOX_POLL_QUERIES = 6
# And the rows of the page, their current proposals and their approvals: what the inbox
# cost before routing and notifications (bench/README's page bench counts the same).
INBOX_PAGE_QUERIES = UNCHANGED_INBOX_POLL_QUERIES + 3


def test_the_inbox_costs_what_it_cost_before_routing(
    runtime: Runtime,
    second_reviewer: Any,
    rules: dict[str, RoutingRuleVersion],
    django_assert_num_queries: Any,
) -> None:
    """A reader in a routing group, with unread notifications: the routed rows still come
    first, badged, and the header counts, for no query more than an inbox without either."""
    large = runtime.propose(arguments=refund(90000), client_ref="large").json()["occurrence_id"]
    propose_many(runtime, 30)
    NotificationDelivery.objects.create(
        tenant_id=runtime.key.tenant_id,
        channel=Channel.CONSOLE,
        user=second_reviewer,
        body={},
        next_attempt_at=timezone.now(),
    )
    client = signed_in(second_reviewer)
    pages = []
    for headers in ({}, {"HX-Request": "true"}):  # the whole page, and its table alone
        with django_assert_num_queries(INBOX_PAGE_QUERIES):
            response = client.get("/reviews/", headers=headers)
        assert response.status_code == 200
        page = parse(response)
        first = next(tr for tr in page.find_all("tr") if "data-occurrence-id" in tr.attrs)
        assert (first.attrs["data-occurrence-id"], "data-routed" in first.attrs) == (large, True)
        assert len(row_ids(page)) == 25
        pages.append(page)
    assert pages[0].text("unread-count") == "1"
    poll = str(pages[0].attr("inbox-list", "hx-get"))
    with django_assert_num_queries(UNCHANGED_INBOX_POLL_QUERIES):
        assert client.get(poll, headers={"HX-Request": "true"}).status_code == 204


def test_unchanged_inbox_poll_answers_204_before_reading_rows(
    runtime: Runtime, reviewer: Any, django_assert_num_queries: Any
) -> None:
    propose_many(runtime, 30)
    client = signed_in(reviewer)
    # ?page=99 is past the end: the page served is the last, and so is its stamp.
    urls = (
        "/reviews/",
        "/reviews/?page=2",
        "/reviews/?page=99",
        "/reviews/?tool=issue_refund&state=all",
    )
    for url in urls:
        # The stamp holds the minute (the rows' ages change with it): a render and its poll
        # on either side of a minute's turn differ for that reason alone, so that pair is
        # tried once more.
        for _ in range(2):
            minute = timezone.now().replace(second=0, microsecond=0)
            poll = str(parse(client.get(url)).attr("inbox-list", "hx-get"))
            with django_assert_num_queries(UNCHANGED_INBOX_POLL_QUERIES):
                status = client.get(poll, headers={"HX-Request": "true"}).status_code
            if timezone.now().replace(second=0, microsecond=0) == minute:
                break
        assert status == 204, url


def test_review_page_reads_each_approvals_command_with_the_approval(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(runtime)
    approve(occurrence_id, reviewer)
    token = runtime.token(occurrence_id).json()["token"]
    assert runtime.claim(token, "exec-1").json()["decision"] == "approved"
    command = Command.objects.get(occurrence_id=occurrence_id)
    client = signed_in(reviewer)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(f"/reviews/{occurrence_id}/")
    assert response.status_code == 200
    assert str(command.pk) in response.content.decode()  # "command <id>" in the panel
    statements = [q["sql"] for q in captured.captured_queries]
    # No statement reads commands alone; one joins them to the approvals it reads (the ORM
    # writes the table's name quoted, the pages' own SQL does not).
    assert not [sql for sql in statements if re.match(r'SELECT "?approvals_command"?\.', sql)]
    assert any(re.search(r'LEFT (OUTER )?JOIN "?approvals_command"?', sql) for sql in statements)
