"""The occurrence timeline pages its audit events by keyset cursor, as the review page pages
its history: fifty at a time, each adapter invocation on the one window whose span it
started in, and queries that do not grow with the history."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import AuditEvent, Command, Epoch, Occurrence
from approvals.web.selectors.history import HISTORY_PAGE
from reconciliation.models import AdapterInvocation
from tests.approvals.test_views_html import Html, parse, propose
from tests.conftest import PASSWORD, Runtime
from tests.reconciliation.conftest import claim_command

pytestmark = pytest.mark.django_db


@pytest.fixture
def ops(operator: Any) -> Client:
    client = Client()
    assert client.login(username=operator.username, password=PASSWORD)
    return client


def timeline_url(occurrence_id: Any) -> str:
    return f"/operations/occurrences/{occurrence_id}/"


def grow(occurrence_id: Any, notes: int) -> list[AuditEvent]:
    """``notes`` more events, one second apart after everything recorded so far."""
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    start = AuditEvent.objects.filter(occurrence=occurrence).latest("id").source_time
    return [
        AuditEvent.objects.create(
            kind="test.note",
            tenant_id=occurrence.tenant_id,
            occurrence=occurrence,
            actor=f"tester-{n}",
            source_time=start + timedelta(seconds=n + 1),
            data={"reason": f"note {n}"},
        )
        for n in range(notes)
    ]


def invoke(command: Command, number: int, started_at: datetime) -> AdapterInvocation:
    return AdapterInvocation.objects.create(
        command=command,
        epoch=Epoch.objects.get(occurrence_id=command.occurrence_id, number=1),
        number=number,
        justification="first_delivery",
        started_at=started_at,
    )


def queries_for(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured.captured_queries)


def section(page: Html) -> str:
    """The timeline section's source."""
    source = page.source[page.source.index('<section id="timeline"') :]
    return source[: source.index("</section>")]


def caption(page: Html) -> str:
    return " ".join(page.text("timeline-h").split())


def notes_shown(page: Html) -> list[int]:
    return [int(n) for n in re.findall(r"note (\d+)\b", page.text("timeline"))]


def events_shown(page: Html) -> list[str]:
    """The producer event ids of the events shown, in page order."""
    return re.findall(r'<code class="small mono">([0-9a-f-]{36})</code>', section(page))


def invocations_shown(page: Html) -> list[int]:
    return [int(n) for n in re.findall(r"invocation (\d+) \(epoch", page.text("timeline"))]


def pager(page: Html) -> list[str]:
    """The timeline pager's link texts, in order."""
    if not page.has("timeline-pages"):
        return []
    nav = page.source[page.source.index('id="timeline-pages"') :]
    nav = nav[: nav.index("</nav>")]
    return [" ".join(text.split()) for text in re.findall(r"<a [^>]*>([^<]*)</a>", nav)]


def pager_link(page: Html, text: str) -> str | None:
    if not page.has("timeline-pages"):
        return None
    nav = page.source[page.source.index('id="timeline-pages"') :]
    nav = nav[: nav.index("</nav>")]
    for href, label in re.findall(r'<a [^>]*href="([^"]*)"[^>]*>([^<]*)</a>', nav):
        if label == text:
            return html.unescape(href)
    return None


def walk(client: Client, url: str, text: str) -> list[Html]:
    """The pages reached from ``url`` by following the pager's ``text`` link to its end."""
    pages = []
    next_url: str | None = url
    while next_url is not None:
        response = client.get(next_url)
        assert response.status_code == 200
        pages.append(parse(response))
        next_url = pager_link(pages[-1], text)
        assert len(pages) < 20, "the pager never ends"
    return pages


def test_the_timeline_shows_the_newest_window_and_counts_them_all(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    grow(command.occurrence_id, 120)
    total = AuditEvent.objects.filter(occurrence_id=command.occurrence_id).count()

    page = parse(ops.get(timeline_url(command.occurrence_id)))

    # The newest fifty, oldest first: notes 70 to 119; the claim's events are older.
    assert notes_shown(page) == list(range(70, 120))
    assert len(events_shown(page)) == HISTORY_PAGE == 50
    assert "claim.approved" not in page.text("timeline")
    assert f"latest 50 of {total:,} events, oldest first" in caption(page)
    # The pager, labelled, leads back; there is nothing newer.
    assert page.attr("timeline-pages", "aria-label") == "Timeline pages"
    assert pager(page) == ["Oldest events", "← Earlier events"]
    assert page.attr("history-earlier", "rel") == "prev"
    earlier = pager_link(page, "← Earlier events")
    assert earlier is not None
    assert earlier.startswith(f"{timeline_url(command.occurrence_id)}?before=")
    assert earlier.endswith("#timeline")
    assert pager_link(page, "Oldest events") == (
        f"{timeline_url(command.occurrence_id)}?after=0#timeline"
    )


def test_a_short_timeline_has_no_pager(runtime: Runtime, reviewer: Any, ops: Client) -> None:
    command = claim_command(runtime, reviewer)
    total = AuditEvent.objects.filter(occurrence_id=command.occurrence_id).count()

    page = parse(ops.get(timeline_url(command.occurrence_id)))

    assert f"{total} events, oldest first" in caption(page)
    assert not page.has("timeline-pages")
    assert len(events_shown(page)) == total


def test_earlier_links_reach_every_event_once(runtime: Runtime, reviewer: Any, ops: Client) -> None:
    command = claim_command(runtime, reviewer)
    grow(command.occurrence_id, 120)
    recorded = [
        str(e)
        for e in AuditEvent.objects.filter(occurrence_id=command.occurrence_id)
        .order_by("id")
        .values_list("event_id", flat=True)
    ]
    total = len(recorded)
    url = timeline_url(command.occurrence_id)
    newest = queries_for(ops, url)

    backwards = walk(ops, url, "← Earlier events")

    assert len(backwards) == 3  # 50 + 50 + what is left
    seen = [event for page in reversed(backwards) for event in events_shown(page)]
    assert seen == recorded, "every event once, in order"
    middle, oldest = backwards[1], backwards[2]
    assert notes_shown(middle) == list(range(20, 70))
    assert f"events {total - 99} to {total - 50} of {total}, oldest first" in caption(middle)
    assert pager(middle) == ["← Earlier events", "Later events →"]
    assert f"events 1 to {total - 100} of {total}, oldest first" in caption(oldest)
    assert pager(oldest) == ["Later events →", "Latest events"]
    assert "occurrence.proposed" in oldest.text("timeline")
    # An older window costs at most the count of what precedes it and its span's end.
    for older in (pager_link(backwards[0], "← Earlier events"), f"{url}?after=0"):
        assert older is not None
        assert queries_for(ops, older) <= newest + 2

    # Forwards from the oldest: other windows, the same events, each once.
    forwards = walk(ops, f"{url}?after=0", "Later events →")
    assert [event for page in forwards for event in events_shown(page)] == recorded
    assert pager(forwards[-1]) == ["Oldest events", "← Earlier events"]


def test_queries_do_not_grow_with_the_history(
    runtime: Runtime, reviewer: Any, ops: Client, django_assert_max_num_queries: Any
) -> None:
    small = propose(runtime)
    grow(small, 1)
    assert AuditEvent.objects.filter(occurrence_id=small).count() == 2
    few = queries_for(ops, timeline_url(small))

    large = propose(runtime)
    grow(large, 119)
    assert AuditEvent.objects.filter(occurrence_id=large).count() == 120
    with django_assert_max_num_queries(few):
        response = ops.get(timeline_url(large))
    assert response.status_code == 200
    assert len(events_shown(parse(response))) == 50

    # The same with a command, its adapter invocations and an operator's page of them.
    claimed = claim_command(runtime, reviewer, ref="small")
    invoke(claimed, 1, timezone.now())
    few_claimed = queries_for(ops, timeline_url(claimed.occurrence_id))
    busy = claim_command(runtime, reviewer, ref="busy")
    notes = grow(busy.occurrence_id, 120)
    for n in range(1, 11):
        invoke(busy, n, notes[n * 10].source_time)
    with django_assert_max_num_queries(few_claimed):
        response = ops.get(timeline_url(busy.occurrence_id))
    assert response.status_code == 200
    busy_page = parse(response)
    assert len(events_shown(busy_page)) == 50
    assert invocations_shown(busy_page)


def test_each_invocation_appears_once_across_windows_in_time_order(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    notes = grow(command.occurrence_id, 120)
    second = timedelta(seconds=1)
    first_event = AuditEvent.objects.filter(occurrence_id=command.occurrence_id).earliest("id")
    # Windows from the newest: notes 70-119, notes 20-69, the claim's events and notes 0-19.
    invoke(command, 1, first_event.source_time - timedelta(hours=1))  # before everything
    invoke(command, 2, notes[45].source_time + second / 2)  # inside the middle window
    invoke(command, 3, notes[69].source_time + second / 2)  # between two windows
    invoke(command, 4, notes[70].source_time)  # at the newest window's first event
    invoke(command, 5, notes[119].source_time + timedelta(days=1))  # after everything

    newest, middle, oldest = walk(ops, timeline_url(command.occurrence_id), "← Earlier events")

    assert invocations_shown(newest) == [4, 5]
    assert invocations_shown(middle) == [2, 3]
    assert invocations_shown(oldest) == [1]
    # Merged by time: each next to the events around it.
    text = middle.text("timeline")
    assert text.index("note 45") < text.index("invocation 2 (") < text.index("note 46")
    assert text.index("note 69") < text.index("invocation 3 (")
    text = newest.text("timeline")
    assert text.index("invocation 4 (") < text.index("note 70")
    assert text.index("note 119") < text.index("invocation 5 (")
    assert "adapter invocations" in caption(newest)

    # Windows cut elsewhere (forwards from the oldest) still show each once.
    forwards = walk(ops, f"{timeline_url(command.occurrence_id)}?after=0", "Later events →")
    shown = [n for page in forwards for n in invocations_shown(page)]
    assert sorted(shown) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "query",
    [
        "?before=abc",
        "?after=-1",
        "?before=",
        "?before=1.5&after=x",
        "?before=99999999999999999999",  # longer than any event id
        "?before=%F0%9F%92%A5",
    ],
)
def test_a_bad_cursor_shows_the_newest_window(
    runtime: Runtime, reviewer: Any, ops: Client, query: str
) -> None:
    command = claim_command(runtime, reviewer)
    grow(command.occurrence_id, 60)

    response = ops.get(f"{timeline_url(command.occurrence_id)}{query}")

    assert response.status_code == 200
    page = parse(response)
    assert notes_shown(page) == list(range(10, 60))
    assert "latest 50 of" in caption(page)


def test_a_cursor_past_the_end_shows_no_events_and_the_way_back(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    invoke(command, 1, timezone.now())
    notes = grow(command.occurrence_id, 60)
    total = AuditEvent.objects.filter(occurrence_id=command.occurrence_id).count()

    response = ops.get(f"{timeline_url(command.occurrence_id)}?after={notes[-1].pk}")

    assert response.status_code == 200
    page = parse(response)
    assert events_shown(page) == [] and invocations_shown(page) == []
    assert f"no events here of {total}" in caption(page)
    assert pager(page) == ["Oldest events", "Latest events"]


def test_another_tenants_occurrence_is_not_found_in_any_window(
    other_runtime: Runtime, ops: Client
) -> None:
    occurrence_id = propose(other_runtime)
    grow(occurrence_id, 60)

    for query in ("", "?before=999999", "?after=0", "?before=abc"):
        assert ops.get(f"{timeline_url(occurrence_id)}{query}").status_code == 404


def test_a_refused_decision_answers_with_the_newest_window(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    grow(command.occurrence_id, 60)

    response = ops.post(
        f"/operations/commands/{command.pk}/compensate?before=5", {"note": "nothing to undo"}
    )

    assert response.status_code == 302, "post/redirect/get: to the timeline, newest first"
    page = parse(ops.get(response["Location"]))
    assert "Refused: the effect is now" in page.text("operator-notice")
    assert notes_shown(page) == list(range(10, 60))
    assert "latest 50 of 65 events" in caption(page)  # the claim's 5 events and 60 notes
    assert pager(page) == ["← Earlier events"]


def test_agent_text_in_a_window_is_escaped_and_revealed(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    occurrence = Occurrence.objects.get(pk=command.occurrence_id)
    AuditEvent.objects.create(
        kind="test.note",
        tenant_id=occurrence.tenant_id,
        occurrence=occurrence,
        actor="<script>alert(1)</script>",
        source_time=timezone.now(),
        data={"reason": "pay\u202eevil<b>"},
    )

    body = section(parse(ops.get(timeline_url(command.occurrence_id))))

    assert "<script>alert(1)</script>" not in body and "<b>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "\u202e" not in body and "202E" in body.upper()
