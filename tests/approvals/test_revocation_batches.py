"""Past bulk revocations are listed: who, when, with which filter, how many; an admin sees
only their tenants' batches, in one query."""

from __future__ import annotations

import re
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import AuditEvent
from tests.approvals.test_admin_pages import (  # noqa: F401 (fixtures)
    ada,
    batch_of,
    gil,
    issued,
    second_key,
)
from tests.approvals.test_views_html import parse, signed_in


def revoke(client: Any, query: str, reason: str) -> None:
    preview = parse(client.get(f"/manage/revocations/?preview=1&{query}"))
    response = client.post(
        "/manage/revocations/revoke", {"batch": batch_of(preview), "reason": reason}
    )
    assert response.status_code == 302


def test_past_batches_list_who_when_filter_and_count(
    ada: Any,  # noqa: F811 (the fixtures imported above)
    gil: Any,  # noqa: F811
    issued: dict[str, str],  # noqa: F811
) -> None:
    client = signed_in(ada)
    assert (
        client.get("/manage/revocations/")
        .content.decode()
        .count('href="/manage/revocations/batches/"')
    )
    revoke(client, "tool=issue_refund", "Compromised agent run")
    revoke(client, "", "Everything else")

    with CaptureQueriesContext(connection) as captured:
        response = client.get("/manage/revocations/batches/")
    assert response.status_code == 200
    page = response.content.decode()
    rows = re.findall(r'<tr data-batch="([0-9a-f]{32})">(.*?)</tr>', page, re.S)
    assert len(rows) == 2
    newest, oldest = (" ".join(re.sub(r"<[^>]+>", " ", cells).split()) for _, cells in rows)
    assert "ada" in oldest and "tool issue_refund" in oldest and "2 approvals" in oldest
    assert "Compromised agent run" in oldest
    assert "ada" in newest and "all" in newest and "1 approval " in f"{newest} "
    assert {batch for batch, _ in rows} == {
        e.data["batch"] for e in AuditEvent.objects.filter(kind="approval.revoked")
    }
    # The batches are one grouped query, besides the session, the user and their roles.
    grouped = [q["sql"] for q in captured.captured_queries if "GROUP BY" in q["sql"]]
    assert len(grouped) == 1

    # Another tenant's admin sees none of them.
    other = signed_in(gil).get("/manage/revocations/batches/").content.decode()
    assert "data-batch=" not in other and "No bulk revocation yet." in other


def test_the_batches_page_is_for_admins_only(tenant: Any, reviewer: Any) -> None:
    assert signed_in(reviewer).get("/manage/revocations/batches/").status_code == 403
