"""Issue 26, the header's unread count: read in the statement that reads the reader's roles
(every page makes it), so the header costs no query of its own, and never stale: a new
console notification shows on the next page, and the page that marks some read (a request's
review page, "Mark all read") counts them no more in its own header."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import Channel, NotificationDelivery
from approvals.web.selectors import access
from tests.approvals.test_callbacks import receiver
from tests.approvals.test_notifications import drain, propose, routed
from tests.approvals.test_views_html import parse, signed_in
from tests.conftest import Runtime

__all__ = ["receiver", "routed"]  # the fixtures of the routed tenant (Slack, the webhook)


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True


def unread(response: Any) -> str:
    """The header's count as the page shows it ("" for none)."""
    assert response.status_code == 200
    page = parse(response)
    return page.text("unread-count") if page.has("unread-count") else ""


def statements(client: Any, url: str) -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    return response, [q["sql"] for q in captured.captured_queries]


def test_the_count_is_read_with_the_roles_on_every_page(
    runtime: Runtime, routed: Any, second_reviewer: Any
) -> None:
    client = signed_in(second_reviewer)
    first = propose(runtime, 90000, "one")
    propose(runtime, 95000, "two")
    drain()
    table = NotificationDelivery._meta.db_table
    for url, shown in (
        ("/reviews/", "2"),
        ("/reviews/bulk/?state=pending_review", "2"),
        ("/account/notifications/", "2"),
        (f"/reviews/{first}/", "1"),  # opened: its notification is read
    ):
        response, sql = statements(client, url)
        assert unread(response) == shown, url
        # One statement counts (the roles'), and it reads the memberships too.
        counting = [s for s in sql if re.search(rf"COUNT\([^)]*\)\s+FROM\s+\"?{table}", s)]
        assert len(counting) == 1, (url, counting)
        assert "approvals_membership" in counting[0]


def test_the_count_is_never_stale(runtime: Runtime, routed: Any, second_reviewer: Any) -> None:
    client = signed_in(second_reviewer)
    assert unread(client.get("/reviews/")) == ""
    first = propose(runtime, 90000, "one")
    second = propose(runtime, 95000, "two")
    drain()
    assert unread(client.get("/reviews/")) == "2"
    # The review page marks its request's notification read after reading the roles: its
    # own header already counts one, and so does the next page.
    assert unread(client.get(f"/reviews/{first}/")) == "1"
    assert unread(client.get("/reviews/")) == "1"
    assert unread(client.get(f"/reviews/{first}/")) == "1"  # nothing more to mark
    # A new console notification shows on the next page: nothing cached to invalidate.
    propose(runtime, 99000, "three")
    drain()
    assert unread(client.get("/account/notifications/")) == "2"
    # "Mark all read" and the notifications page it leads back to shows none.
    marked = client.post("/account/notifications/read", follow=True)
    assert marked.redirect_chain == [("/account/notifications/", 302)]
    assert unread(marked) == ""
    assert unread(client.get(f"/reviews/{second}/")) == ""
    assert not NotificationDelivery.objects.filter(
        user=second_reviewer, channel=Channel.CONSOLE, read_at__isnull=True
    ).exists()


def test_the_count_reads_as_its_orm_twin(
    runtime: Runtime, routed: Any, reviewer: Any, second_reviewer: Any, admin_user: Any
) -> None:
    propose(runtime, 90000, "one")  # finance-leads: second_reviewer
    propose(runtime, 100, "two")  # support: reviewer
    propose(runtime, 200, "three")
    drain()
    counts = {}
    for user in (reviewer, second_reviewer, admin_user):
        read = access.console_memberships(user)
        twin = list(access._memberships_queryset(user.pk))
        assert [m.unread for m in read] == [m.unread for m in twin]  # type: ignore[attr-defined]
        counts[user.username] = access.console_access(user).unread
    assert counts == {reviewer.username: 2, second_reviewer.username: 1, admin_user.username: 0}
