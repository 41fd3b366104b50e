"""The queue says what each item is: the arguments its contract names as identifying (a
payment id, a recipient, a case), who asked and in which run, since when in absolute time;
its columns sort, and any id finds its items, in a constant number of queries and with the
plain SQL held equal to its ORM twin."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Approval, ToolContract
from reconciliation.selectors import queue as queue_selectors
from reconciliation.selectors import queue_search as search_selectors
from reconciliation.selectors.queue import queue_counts, queue_items
from reconciliation.selectors.queue_search import queue_search
from tests.conftest import PASSWORD, REFUND_ARGS, Runtime, approve

pytestmark = pytest.mark.django_db

_ROW = re.compile(r'<tr data-item="([^"]+)"')


@pytest.fixture
def ops(operator: Any) -> Client:
    client = Client()
    assert client.login(username=operator.username, password=PASSWORD)
    return client


def expired(
    runtime: Runtime,
    reviewer: Any,
    payment: str,
    *,
    minutes_ago: int,
    run: str = "run-1",
    by: str = "support-agent",
    amount: int = 8000,
    ref: str = "",
    reason: str = "Damaged parcel",
) -> Approval:
    """A refund of ``payment`` whose approval expired unclaimed: an item of the queue."""
    arguments = {**REFUND_ARGS, "payment_id": payment, "amount_minor": amount, "reason": reason}
    fields = {"client_ref": ref} if ref else {}
    proposed = runtime.propose(arguments=arguments, run_id=run, requested_by=by, **fields)
    assert proposed.status_code == 201, proposed.content
    occurrence_id = proposed.json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    at = timezone.now() - timedelta(minutes=minutes_ago)
    Approval.objects.filter(occurrence_id=occurrence_id).update(
        issued_at=at - timedelta(minutes=15), expires_at=at
    )
    return Approval.objects.get(occurrence_id=occurrence_id)


def listed(client: Client, query: str = "") -> list[str]:
    page = client.get(f"/operations/{query}").content.decode()
    return _ROW.findall(page)


def key(approval: Approval) -> str:
    return f"expired_unclaimed:{approval.pk}"


def test_a_row_shows_the_identifying_argument_the_requester_the_run_and_the_time(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    item = expired(runtime, reviewer, "pay_Zt91", minutes_ago=42, run="run-77", by="billing")

    page = ops.get("/operations/").content.decode()

    row = page[page.index(f'data-item="{key(item)}"') :].split("</tr>")[0]
    assert re.search(r"payment_id</span> <code[^>]*>pay_Zt91</code>", row)
    assert "billing" in row and "run-77" in row
    since = timezone.localtime(item.expires_at)
    assert f'datetime="{since.isoformat()}"' in row
    assert f'title="{since:%Y-%m-%d %H:%M:%S} UTC"' in row
    assert f">{since:%Y-%m-%d %H:%M} UTC</time>" in row, "the absolute time beside the age"
    assert "42\xa0minutes ago" in row


def test_the_contract_names_its_identifying_arguments_or_ids_by_name(db: Any) -> None:
    refund = ToolContract.objects.get(name="issue_refund")
    arguments = {**REFUND_ARGS, "order_id": "o_9"}
    assert refund.identifying(arguments) == [("payment_id", "pay_123")], "the migration's"
    refund.identifying_arguments = []
    assert refund.identifying(arguments) == [("payment_id", "pay_123"), ("order_id", "o_9")]
    refund.identifying_arguments = ["no_such_argument"]
    with pytest.raises(ValidationError):
        refund.clean()
    message = ToolContract.objects.get(name="send_message")
    assert message.identifying({"to": "a@example.com", "subject": "x"}) == [("to", "a@example.com")]


def test_any_id_finds_its_item(runtime: Runtime, reviewer: Any, ops: Client) -> None:
    first = expired(runtime, reviewer, "pay_A1", minutes_ago=30, run="run-a")
    second = expired(runtime, reviewer, "pay_B2", minutes_ago=20, run="run-b", ref="ref-b")
    assert listed(ops) == [key(first), key(second)]

    for q in ("pay_B2", "run-b", str(second.occurrence_id), "ref-b"):
        assert listed(ops, f"?q={q}") == [key(second)], q
    assert listed(ops, "?q=pay_") == [], "a value is found whole, not by its start"
    assert listed(ops, "?q=%25") == []
    page = ops.get("/operations/?q=pay_A1").content.decode()
    assert "<strong>1</strong> approval expired unclaimed" in page
    assert 'value="pay_A1"' in page


def test_the_columns_sort_both_ways(runtime: Runtime, reviewer: Any, ops: Client) -> None:
    small = expired(runtime, reviewer, "pay_Z", minutes_ago=30, amount=1000, by="zed")
    large = expired(runtime, reviewer, "pay_A", minutes_ago=20, amount=9000, by="amy")

    assert listed(ops, "?sort=amount&dir=desc") == [key(large), key(small)]
    assert listed(ops, "?sort=amount") == [key(small), key(large)]
    assert listed(ops, "?sort=action") == [key(large), key(small)]
    assert listed(ops, "?sort=requester") == [key(large), key(small)]
    assert listed(ops, "?sort=age&dir=desc") == [key(large), key(small)]
    assert listed(ops, "?sort=nonsense") == [key(small), key(large)], "oldest first"
    page = ops.get("/operations/?sort=amount&dir=desc").content.decode()
    assert re.search(
        r'aria-sort="descending"><a class="sort" href="[^"]*sort=amount&amp;dir=asc', page
    )


def test_queries_per_queue_page_stay_constant_with_rows_and_with_a_search(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    expired(runtime, reviewer, "pay_0", minutes_ago=50)
    for query in ("", "?q=run-1&sort=action"):
        connection.queries_log.clear()  # a full log (its maxlen) would count nothing
        with CaptureQueriesContext(connection) as few:
            assert ops.get(f"/operations/{query}").status_code == 200
        for n in range(1, 4):
            expired(runtime, reviewer, f"pay_{query and 'q'}{n}", minutes_ago=40 - n)
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as many:
            assert ops.get(f"/operations/{query}").status_code == 200
        assert len(many) == len(few), query


def test_the_search_and_its_filtered_reads_answer_as_their_orm_twins(
    runtime: Runtime, reviewer: Any
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the SQL reads run on PostgreSQL only")
    first = expired(runtime, reviewer, "pay_A1", minutes_ago=30, run="run-a")
    odd = 'a "50%_off\\" deal'
    second = expired(runtime, reviewer, "pay_B2", minutes_ago=20, run="run-b", reason=odd)
    tenant_ids = [runtime.key.tenant_id]
    now = timezone.now()
    queries = [
        "pay_A1",
        odd,
        "run-a",
        "run-1",
        str(first.occurrence_id),
        "%",
        "_",
        "nothing",
    ]
    for q in queries:
        found = queue_search(q=q, tenant_ids=tenant_ids)
        read = queue_items(tenant_ids=tenant_ids, now=now, occurrence_ids=found)
        counts = queue_counts(tenant_ids=tenant_ids, now=now, occurrence_ids=found)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(search_selectors, "on_postgresql", lambda: False)
            patch.setattr(queue_selectors, "on_postgresql", lambda: False)
            twin_found = queue_search(q=q, tenant_ids=tenant_ids)
            twin = queue_items(tenant_ids=tenant_ids, now=now, occurrence_ids=twin_found)
            twin_counts = queue_counts(tenant_ids=tenant_ids, now=now, occurrence_ids=twin_found)
        assert found == twin_found, q
        assert [i.key for i in read] == [i.key for i in twin], q
        assert counts == twin_counts, q
    assert queue_search(q=odd, tenant_ids=tenant_ids) == [second.occurrence_id]
    assert queue_search(q="%", tenant_ids=tenant_ids) == []
    assert queue_search(q="pay_A1", tenant_ids=[tenant_ids[0] + 1000]) == [], "tenants"
