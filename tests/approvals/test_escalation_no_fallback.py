"""An escalation whose rule names no fallback group (or a request no rule routed) reaches
the tenant's admins, by console and e-mail as each chose, rather than nobody; the review
page says so. The fan-out of that escalation reads its audience in one query, counted here
(tests/approvals/test_notification_dispatch.py pins the routed path, unchanged)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Channel, NotificationDelivery, NotificationEvent, Occurrence, Tenant
from approvals.notifications.delivery import event_dispatch
from approvals.notifications.preferences import preference_save
from approvals.reviews.deadlines import occurrence_escalate
from approvals.routing.changes import reviewer_group_save, routing_rule_save
from tests.approvals import smtp_fixture
from tests.approvals.smtp_fixture import Mailbox
from tests.approvals.test_notifications import drain, loopback_allowed, propose
from tests.approvals.test_views_html import parse, signed_in
from tests.conftest import Runtime

pytestmark = pytest.mark.django_db

smtp = smtp_fixture.smtp
__all__ = ["loopback_allowed"]


@pytest.fixture
def no_fallback(tenant: Tenant, admin_user: Any, reviewer: Any) -> None:
    """rita reviews refunds in support; the rule has no fallback group; ada is the admin."""
    for user in (admin_user, reviewer):
        user.email = f"{user.username}@acme.test"
        user.save(update_fields=["email"])
    support = reviewer_group_save(
        tenant=tenant, admin=admin_user, name="support", member_ids=[reviewer.pk]
    ).group
    routing_rule_save(
        tenant=tenant, admin=admin_user, tool="issue_refund", name="refunds", group_ids=[support.pk]
    )


def escalate(occurrence_id: str) -> str:
    Occurrence.objects.filter(pk=occurrence_id).update(
        review_deadline_at=timezone.now() - timedelta(minutes=1)
    )
    assert occurrence_escalate(occurrence_id)
    return str(
        NotificationEvent.objects.get(
            occurrence_id=occurrence_id, kind=NotificationEvent.Kind.ESCALATED
        ).pk
    )


def told(occurrence_id: str) -> list[tuple[str, str]]:
    return sorted(
        NotificationDelivery.objects.filter(
            event__occurrence_id=occurrence_id, event__kind=NotificationEvent.Kind.ESCALATED
        ).values_list("user__username", "channel")
    )


def test_an_escalation_without_a_fallback_group_tells_the_admins(
    runtime: Runtime, no_fallback: None, smtp: Mailbox, admin_user: Any
) -> None:
    occurrence_id = propose(runtime, 1000, "late")
    drain()
    assert [m["To"] for m in smtp.messages] == ["rita@acme.test"]

    escalate(occurrence_id)
    assert drain() == ["delivered"]

    assert [m["To"] for m in smtp.messages] == ["rita@acme.test", "ada@acme.test"]
    assert "Escalated" in str(smtp.messages[1]["Subject"])
    assert told(occurrence_id) == [("ada", Channel.CONSOLE), ("ada", Channel.EMAIL)]
    page = parse(signed_in(admin_user).get("/manage/review-health/"))
    assert page.text("unread-count") == "1"


def test_an_unrouted_escalation_tells_the_admins_as_each_chose(
    runtime: Runtime, tenant: Tenant, admin_user: Any, reviewer: Any, smtp: Mailbox
) -> None:
    admin_user.email = "ada@acme.test"
    admin_user.save(update_fields=["email"])
    preference_save(user_id=admin_user.pk, channel=Channel.EMAIL, mode="none")
    occurrence_id = propose(runtime, 1000, "unrouted")
    drain()

    escalate(occurrence_id)
    drain()

    assert smtp.to("ada@acme.test") == []  # she turned e-mail off
    assert told(occurrence_id) == [("ada", Channel.CONSOLE)]  # the header still counts it


def test_the_admin_who_asked_is_not_told_of_her_own_request(
    runtime: Runtime, no_fallback: None, smtp: Mailbox
) -> None:
    answer = runtime.propose(
        arguments={"payment_id": "p", "amount_minor": 1000, "currency": "EUR", "reason": "r"},
        client_ref="own",
        requested_by="ADA",
    )
    occurrence_id = str(answer.json()["occurrence_id"])
    drain()
    escalate(occurrence_id)
    drain()
    assert told(occurrence_id) == []


def test_the_review_page_says_the_admins_are_told(
    runtime: Runtime, no_fallback: None, reviewer: Any
) -> None:
    page = parse(signed_in(reviewer).get(f"/reviews/{propose(runtime, 1000, 'shown')}/"))
    assert "no fallback group" in page.text("routed-by")
    assert page.text("escalates-to") == "if it escalates, the admins of Acme are told"


def test_the_no_fallback_fan_out_counts_its_statements(
    runtime: Runtime, no_fallback: None, smtp: Mailbox
) -> None:
    occurrence_id = propose(runtime, 1000, "counted")
    drain()
    event = escalate(occurrence_id)
    with CaptureQueriesContext(connection) as queries:
        done = event_dispatch(event)
    assert len(done.sent) == 1  # ada's e-mail (her console count is written delivered)
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    kinds = [s.split()[0] + " " + _table(s) for s in statements]
    assert kinds == [
        "SELECT approvals_notificationevent",  # with its rule version and (no) fallback
        "SELECT auth_user",  # the tenant's admins, with their addresses: the one read more
        "SELECT approvals_notificationpreference",
        "INSERT approvals_notificationdelivery",
        "UPDATE approvals_notificationevent",
        # The attempt recorded: one WITH statement on PostgreSQL, its ORM twin elsewhere.
        *(
            ["WITH approvals_notificationattempt"]
            if connection.vendor == "postgresql"
            else ["INSERT approvals_notificationattempt", "UPDATE approvals_notificationdelivery"]
        ),
    ], statements


def _table(sql: str) -> str:
    found = re.search(r'(?:FROM|INTO|UPDATE) "(\w+)"(?! U\d)', sql)
    return found.group(1) if found else ""
