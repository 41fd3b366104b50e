"""Review health: time to decision per tool (p50/p95), escalations and timeouts per day, on
the admins' panel and on /metrics."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import AuditEvent, Membership, Occurrence, Tenant, ToolContract
from approvals.reviews import health
from approvals.reviews.deadlines import occurrence_escalate, occurrence_time_out
from approvals.reviews.decisions import occurrence_reject
from approvals.reviews.health import deadline_days, decision_times, percentile
from approvals.reviews.proposals import occurrence_propose
from tests.approvals.test_views_html import parse, signed_in
from tests.conftest import REFUND_ARGS, Runtime, approve, make_user

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-for-tests-0123456789"


def propose(runtime: Runtime, n: int, tool: str = "issue_refund") -> Occurrence:
    arguments: dict[str, Any] = (
        {**REFUND_ARGS, "payment_id": f"pay_{n}"}
        if tool == "issue_refund"
        else {"to": f"ana{n}@example.com", "subject": "Hi", "body": "Parcel."}
    )
    occurrence, _ = occurrence_propose(
        runtime_key=runtime.key, tool=tool, arguments=arguments, run_id=f"run-{n}", reason="r"
    )
    occurrence.refresh_from_db()
    return occurrence


def decided_after(occurrence: Occurrence, seconds: float) -> None:
    """Move the proposal back so that the decision recorded now took ``seconds``."""
    event = AuditEvent.objects.filter(
        occurrence=occurrence, kind__in=["approval.issued", "occurrence.rejected"]
    ).latest("id")
    Occurrence.objects.filter(pk=occurrence.pk).update(
        created_at=event.source_time - timedelta(seconds=seconds)
    )


def decide(
    runtime: Runtime, reviewer: Any, seconds: list[float], tool: str = "issue_refund"
) -> None:
    for n, s in enumerate(seconds):
        occurrence = propose(runtime, n + 1000 * (tool != "issue_refund"), tool)
        if n % 2:
            occurrence_reject(occurrence=occurrence, reviewer=reviewer, reason="no")
        else:
            approve(str(occurrence.pk), reviewer)
        decided_after(occurrence, s)


def test_percentile_is_postgresqls_percentile_cont() -> None:
    assert percentile([10.0], 0.95) == 10.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([0.0, 100.0], 0.95) == pytest.approx(95.0)


def test_time_to_decision_per_tool_counts_reviewers_not_policy_nor_other_tenants(
    runtime: Runtime, other_runtime: Runtime, reviewer: Any, other_tenant: Tenant, tenant: Tenant
) -> None:
    decide(runtime, reviewer, [60, 120, 180, 240, 3600])
    decide(runtime, reviewer, [30], tool="send_message")
    theirs = make_user("gil", other_tenant, Membership.Role.REVIEWER)
    decide(other_runtime, theirs, [99999])
    # A policy's rejection of a repeat (the same action again in its run) is no reviewer's
    # decision.
    ToolContract.objects.filter(name="issue_refund").update(reject_repeats=True)
    repeat = propose(runtime, 1)  # run-1, pay_1: rejected above (n=1 of the first five)
    assert AuditEvent.objects.get(occurrence=repeat, kind="occurrence.rejected").actor == "policy"
    Occurrence.objects.filter(pk=repeat.pk).update(created_at=timezone.now() - timedelta(hours=5))
    since = timezone.now() - timedelta(days=1)

    times = {t.tool: t for t in decision_times(since=since, tenant_ids=[tenant.pk])}

    refunds = times["issue_refund"]
    assert refunds.decided == 5
    assert refunds.p50 == pytest.approx(180, abs=1)
    assert refunds.p95 == pytest.approx(240 + 0.8 * (3600 - 240), abs=1)
    assert times["send_message"].decided == 1
    everyone = {t.tool: t for t in decision_times(since=since)}
    assert everyone["issue_refund"].decided == 6


def test_the_sql_and_its_orm_twin_agree(
    runtime: Runtime, reviewer: Any, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the SQL read runs on PostgreSQL only")
    decide(runtime, reviewer, [5, 50, 500, 5000, 7, 70])
    decide(runtime, reviewer, [1, 2, 3], tool="send_message")
    since = timezone.now() - timedelta(days=1)
    read = decision_times(since=since, tenant_ids=[tenant.pk])
    monkeypatch.setattr(health, "on_postgresql", lambda: False)
    twin = decision_times(since=since, tenant_ids=[tenant.pk])
    assert [(t.tool, t.decided) for t in read] == [(t.tool, t.decided) for t in twin]
    for a, b in zip(read, twin, strict=True):
        assert a.p50 == pytest.approx(b.p50, abs=0.01)
        assert a.p95 == pytest.approx(b.p95, abs=0.01)


def escalate_and_time_out(runtime: Runtime, n: int, *, time_out: bool) -> None:
    occurrence = propose(runtime, n)
    past = timezone.now() - timedelta(minutes=5)
    Occurrence.objects.filter(pk=occurrence.pk).update(
        review_deadline_at=past, final_deadline_at=past + timedelta(minutes=1)
    )
    assert occurrence_escalate(occurrence.pk)
    if time_out:
        assert occurrence_time_out(occurrence.pk)


def test_escalations_and_timeouts_per_day(runtime: Runtime, tenant: Tenant) -> None:
    escalate_and_time_out(runtime, 1, time_out=True)
    escalate_and_time_out(runtime, 2, time_out=False)
    escalate_and_time_out(runtime, 3, time_out=False)
    now = timezone.now()

    days = deadline_days(since=now - timedelta(days=6), until=now, tenant_ids=[tenant.pk])

    assert len(days) == 7  # every day of the window, a quiet one at 0
    assert [d.day for d in days] == [(now - timedelta(days=6 - n)).date() for n in range(7)]
    assert (days[-1].escalated, days[-1].timed_out) == (3, 1)
    assert sum(d.escalated + d.timed_out for d in days[:-1]) == 0
    # Another tenant's window, and a window that begins after the events, count none.
    assert (
        deadline_days(since=now - timedelta(days=1), until=now, tenant_ids=[-1])[-1].escalated == 0
    )
    later = timezone.now() + timedelta(seconds=1)
    assert deadline_days(since=later, until=later, tenant_ids=[tenant.pk])[-1].escalated == 0


def test_metrics_show_time_to_decision_and_deadlines(
    runtime: Runtime, reviewer: Any, client: Any, settings: Any
) -> None:
    settings.METRICS_TOKEN = TOKEN
    decide(runtime, reviewer, [100, 200, 300])
    escalate_and_time_out(runtime, 7, time_out=True)
    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    assert 'console_review_time_to_decision_seconds{quantile="0.5",tool="issue_refund"}' in text
    assert 'console_review_time_to_decision_seconds{quantile="0.95",tool="issue_refund"}' in text
    assert 'console_review_decisions_last_day{tool="issue_refund"} 3.0' in text
    assert 'console_review_deadline_events_last_day{event="escalated"} 1.0' in text
    assert 'console_review_deadline_events_last_day{event="timed_out"} 1.0' in text


def test_the_panel_is_for_admins_and_their_tenants_only(
    runtime: Runtime, other_runtime: Runtime, reviewer: Any, tenant: Tenant, other_tenant: Tenant
) -> None:
    admin = make_user("ada", tenant, Membership.Role.ADMIN)
    decide(runtime, reviewer, [60])
    theirs = make_user("gil", other_tenant, Membership.Role.REVIEWER)
    decide(other_runtime, theirs, [30], tool="send_message")

    assert signed_in(reviewer).get("/manage/review-health/").status_code == 403
    page = signed_in(admin).get("/manage/review-health/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-tool="issue_refund"' in html
    assert 'data-tool="send_message"' not in html  # only in the other tenant
    assert parse(page).text("times-h") == "Time to decision per tool"


def test_the_panel_reads_the_same_number_of_queries_however_much_was_decided(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    admin = make_user("ada", tenant, Membership.Role.ADMIN)
    client = signed_in(admin)
    decide(runtime, reviewer, [60])

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/manage/review-health/", {"days": "30"}).status_code == 200
        return len(captured)

    few = queries()
    decide(runtime, reviewer, [10, 20, 30, 40])
    decide(runtime, reviewer, [5, 6], tool="send_message")
    escalate_and_time_out(runtime, 50, time_out=True)
    assert queries() == few
    assert few <= 6  # session, user, memberships, the two reads (and a savepoint at most)
