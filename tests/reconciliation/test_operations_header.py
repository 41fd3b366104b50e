"""The operations pages (queue, timeline, investigations) show the header's unread
notifications' count as the approvals pages do, read with the roles: no query of their own
(every statement that counts notifications is the roles' statement, and the pages read as
many statements with unread notifications as without)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import Membership, NotificationEvent, Tenant
from approvals.notifications.fanout import fan_out
from tests.approvals.test_views_html import parse, propose
from tests.conftest import Runtime, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def orla(tenant: Tenant) -> Any:
    """An operator who also reviews: the header links her notifications."""
    return make_user("orla", tenant, Membership.Role.OPERATOR, Membership.Role.REVIEWER)


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def pages(occurrence_id: str) -> list[str]:
    return [
        "/operations/",
        f"/operations/occurrences/{occurrence_id}/",
        "/investigations/",
        f"/investigations/?q={occurrence_id}",
    ]


def told(runtime: Runtime, ref: str) -> str:
    """A request no rule routes: every reviewer of the tenant gets a console notification."""
    occurrence_id = propose(runtime, client_ref=ref)
    for event in NotificationEvent.objects.filter(fanned_out_at__isnull=True):
        fan_out(event.pk)
    return occurrence_id


def statements(client: Client, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return [q["sql"] for q in captured.captured_queries]


def test_the_operations_pages_show_the_unread_count(runtime: Runtime, orla: Any) -> None:
    client = signed_in(orla)
    occurrence_id = propose(runtime, client_ref="quiet")
    for url in pages(occurrence_id):
        page = parse(client.get(url))
        assert page.has("notifications-link") and not page.has("unread-count"), url

    told(runtime, "one")  # "quiet" and "one" fanned out: two notifications
    told(runtime, "two")
    for url in pages(occurrence_id):
        assert parse(client.get(url)).text("unread-count") == "3", url


def test_the_count_costs_the_operations_pages_no_query(runtime: Runtime, orla: Any) -> None:
    client = signed_in(orla)
    occurrence_id = propose(runtime, client_ref="counted")
    for url in pages(occurrence_id):
        client.get(url)  # warm (sessions, caches)
    before = {url: statements(client, url) for url in pages(occurrence_id)}
    told(runtime, "one")
    for url, read in before.items():
        after = statements(client, url)
        assert len(after) == len(read), url
        counting = [sql for sql in after if "approvals_notificationdelivery" in sql]
        assert len(counting) == 1 and "approvals_membership" in counting[0], url


def test_an_operator_who_neither_reviews_nor_administers_gets_no_notifications_link(
    runtime: Runtime, operator: Any
) -> None:
    page = parse(signed_in(operator).get("/operations/"))
    assert not page.has("notifications-link")
