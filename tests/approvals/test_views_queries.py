"""A page costs the same number of queries however many rows it shows."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import services
from approvals.models import Occurrence
from tests.approvals.test_views_html import parse, propose, signed_in
from tests.approvals.test_views_inbox import propose_many, row_ids
from tests.conftest import Runtime, approve


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
    assert len(row_ids(parse(response))) == 25
    with django_assert_max_num_queries(few):
        client.get("/reviews/?state=all", headers={"HX-Request": "true"})


def _grow_history(occurrence_id: str, events: int) -> None:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    for n in range(events):
        services.audit_record(
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
    assert parse(response).text("history").count("test.note") == 39
    with django_assert_max_num_queries(few_panel):
        client.get(f"/reviews/{large}/panel", headers={"HX-Request": "true"})


def test_review_page_queries_do_not_grow_with_versions_and_votes(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(second_reviewer)
    occurrence_id = propose(runtime)
    few = queries_for(client, f"/reviews/{occurrence_id}/")
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    for amount in range(100, 110):
        digest = occurrence.proposals.get(is_current=True).action_digest
        services.proposal_edit(
            occurrence=occurrence,
            editor=reviewer,
            arguments={"payment_id": "p", "amount_minor": amount, "currency": "EUR", "reason": "r"},
            seen_digest=digest,
        )
    with django_assert_max_num_queries(few):
        client.get(f"/reviews/{occurrence_id}/")


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
        if "COUNT(" in q["sql"] and f'FROM "{table}"' in q["sql"]
    ]
    assert counts and all("tool_id" in sql for sql in counts)
    assert not [sql for sql in counts if "JOIN" in sql]
