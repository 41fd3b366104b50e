""" "I'm on it" (issue 25): an operator takes a queue item, the others see who has it, the
take lapses by the database's clock or is let go (by hand, or by a decision that resolves
the item), another operator takes it over only naming who had it; the queue filters by
mine and unowned in the same statements, its query count unchanged by the owners."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.audit.record import db_now
from approvals.errors import ErrorCode, ServiceError
from approvals.models import Approval, AuditEvent, Command, Membership, Tenant
from approvals.vocabulary import AuditKind, EventReason
from reconciliation import takes
from reconciliation.models import QueueTake
from reconciliation.operator_actions import command_accept_ambiguity, command_reconcile
from reconciliation.selectors import queue as queue_selectors
from reconciliation.selectors.queue import Owner, queue_counts, queue_items
from reconciliation.takes import (
    occurrence_release,
    occurrence_take,
    take_holder,
)
from tests.conftest import PASSWORD, Runtime, make_user
from tests.reconciliation.conftest import claim_command
from tests.reconciliation.test_queue_identifies import expired

pytestmark = pytest.mark.django_db

_ROW = re.compile(r'<tr data-item="([^"]+)"')


@pytest.fixture
def rita(tenant: Tenant) -> Any:
    user = make_user("rita.ops", tenant, Membership.Role.OPERATOR)
    user.first_name = "Rita"
    user.save(update_fields=["first_name"])
    return user


@pytest.fixture
def sam(tenant: Tenant) -> Any:
    return make_user("sam", tenant, Membership.Role.OPERATOR)


def client_of(user: Any, **options: Any) -> Client:
    client = Client(**options)
    assert client.login(username=user.username, password=PASSWORD)
    return client


def take(user: Any, approval: Approval, **fields: Any) -> Any:
    return occurrence_take(
        occurrence_id=approval.occurrence_id,
        tenant_ids=[approval.tenant_id],
        user=user,
        **fields,
    )


def refusal_of(call: Any) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        call()
    return caught.value


def listed(client: Client, query: str = "") -> list[str]:
    return _ROW.findall(client.get(f"/operations/{query}").content.decode())


def key(approval: Approval) -> str:
    return f"expired_unclaimed:{approval.pk}"


def events(kind: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=kind).order_by("id"))


# --- the service --------------------------------------------------------------------------


def test_a_take_records_who_when_and_the_tenant_with_an_audit_event(
    runtime: Runtime, reviewer: Any, rita: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    before = db_now()

    taken = take(rita, item)

    row = QueueTake.objects.get(occurrence_id=item.occurrence_id)
    assert (row.holder_id, row.holder_name, row.tenant_id) == (rita.pk, "Rita", item.tenant_id)
    assert row.taken_at is not None and row.expires_at is not None and row.taken_at >= before
    assert row.expires_at - row.taken_at == timedelta(minutes=30)
    assert taken.holder.name == "Rita" and "You are on it" in taken.message
    [event] = events(AuditKind.OPERATIONS_TAKEN)
    assert (event.actor, event.occurrence_id, event.tenant_id) == (
        "rita.ops",
        item.occurrence_id,
        item.tenant_id,
    )
    assert event.data["holder"] == "Rita"


def test_another_operator_is_told_who_has_it_and_nothing_changes(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    take(rita, item)

    refused = refusal_of(lambda: take(sam, item))

    assert refused.code == ErrorCode.TAKEN_BY_OTHER and refused.status == 409
    assert refused.message.startswith("Rita is on it since ")
    assert QueueTake.objects.get(occurrence_id=item.occurrence_id).holder_id == rita.pk
    assert len(events(AuditKind.OPERATIONS_TAKEN)) == 1


def test_taking_ones_own_item_again_renews_it_without_a_new_event(
    runtime: Runtime, reviewer: Any, rita: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    first = take(rita, item)
    QueueTake.objects.filter(occurrence_id=item.occurrence_id).update(
        expires_at=db_now() + timedelta(minutes=1)
    )

    again = take(rita, item)

    row = QueueTake.objects.get(occurrence_id=item.occurrence_id)
    assert row.taken_at == first.holder.taken_at, "still on it since the first take"
    assert row.expires_at is not None and row.expires_at > db_now() + timedelta(minutes=29)
    assert "still on it" in again.message
    assert len(events(AuditKind.OPERATIONS_TAKEN)) == 1


def test_a_take_over_names_the_holder_the_page_showed(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any, tenant: Tenant
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    take(rita, item)
    tom = make_user("tom", tenant, Membership.Role.OPERATOR)

    over = take(sam, item, take_over=rita.pk)

    assert "from Rita" in over.message
    assert QueueTake.objects.get(occurrence_id=item.occurrence_id).holder_id == sam.pk
    [event] = events(AuditKind.OPERATIONS_TAKEN_OVER)
    assert event.actor == "sam" and event.data["from"] == "Rita"
    # Tom's page still showed Rita: his take-over names a holder who no longer has it.
    stale = refusal_of(lambda: take(tom, item, take_over=rita.pk))
    assert stale.code == ErrorCode.TAKEN_BY_OTHER and stale.message.startswith("sam is on it")
    assert QueueTake.objects.get(occurrence_id=item.occurrence_id).holder_id == sam.pk


def test_the_holder_lets_it_go_and_nobody_else_can(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    take(rita, item)

    not_theirs = refusal_of(
        lambda: occurrence_release(
            occurrence_id=item.occurrence_id, tenant_ids=[item.tenant_id], user=sam
        )
    )
    assert not_theirs.code == ErrorCode.NOT_HOLDER and "Rita is on it" in not_theirs.message
    assert QueueTake.objects.get(occurrence_id=item.occurrence_id).holder_id == rita.pk

    occurrence_release(occurrence_id=item.occurrence_id, tenant_ids=[item.tenant_id], user=rita)

    row = QueueTake.objects.get(occurrence_id=item.occurrence_id)
    assert (row.holder_id, row.taken_at, row.expires_at) == (None, None, None)
    [event] = events(AuditKind.OPERATIONS_RELEASED)
    assert (event.actor, event.reason_code) == ("rita.ops", EventReason.LET_GO)
    take(sam, item)  # unowned again: anyone takes it without taking over


def _moved_after_the_read(monkeypatch: Any, item: Approval, mover: Any) -> None:
    """Between the service's read of the row and its conditional update, ``mover`` takes
    the item (the database's clock is read right after the row)."""
    real_now = takes.db_now
    calls: list[int] = []

    def now_then_moved() -> Any:
        if not calls:
            calls.append(1)
            now = real_now()
            QueueTake.objects.filter(occurrence_id=item.occurrence_id).update(
                holder_id=mover.pk,
                holder_name=takes.display_name(mover),
                taken_at=now,
                expires_at=now + timedelta(minutes=30),
            )
        return real_now()

    monkeypatch.setattr(takes, "db_now", now_then_moved)


def test_the_guard_refuses_a_take_whose_row_moved_after_it_was_read(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any, monkeypatch: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    _moved_after_the_read(monkeypatch, item, sam)

    refused = refusal_of(lambda: take(rita, item))

    assert refused.code == ErrorCode.TAKEN_BY_OTHER and refused.message.startswith("sam is on")
    # (Sam's move ran on this test's connection, so the refusal's rollback took it back
    # too; between processes it stands: test_take_races.)
    assert events(AuditKind.OPERATIONS_TAKEN) == [], "the loser records nothing"


def test_a_double_submit_that_lost_to_itself_is_still_taken(
    runtime: Runtime, reviewer: Any, rita: Any, monkeypatch: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    _moved_after_the_read(monkeypatch, item, rita)

    taken = take(rita, item)

    assert taken.holder.user_id == rita.pk and taken.message == "You are on it."


def test_a_take_lapses_by_the_database_clock(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any, settings: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    take(rita, item)
    assert take_holder(occurrence_id=item.occurrence_id)[0] is not None
    # Its expiry a second ago by the database's clock, whatever this process's clock says.
    QueueTake.objects.filter(occurrence_id=item.occurrence_id).update(
        expires_at=db_now() - timedelta(seconds=1)
    )

    assert take_holder(occurrence_id=item.occurrence_id)[0] is None
    [listed_item] = queue_items(tenant_ids=[item.tenant_id], now=timezone.now())
    assert listed_item.holder is None
    taken = take(sam, item)  # anyone's again, no take-over needed
    assert "You are on it" in taken.message
    [event] = events(AuditKind.OPERATIONS_TAKEN)[1:]
    assert event.actor == "sam"


def test_the_take_lasts_the_configured_minutes(
    runtime: Runtime, reviewer: Any, rita: Any, settings: Any
) -> None:
    settings.OPERATIONS_TAKE_MINUTES = 0
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)

    take(rita, item)

    assert take_holder(occurrence_id=item.occurrence_id)[0] is None, "lapsed at once"


def _unknown(runtime: Runtime, reviewer: Any, ref: str) -> Command:
    command = claim_command(runtime, reviewer, "send_message", ref=ref)
    Command.objects.filter(pk=command.pk).update(state=Command.State.OUTCOME_UNKNOWN)
    command.refresh_from_db()
    return command


def test_a_resolving_decision_lets_the_holder_go(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any
) -> None:
    reconciled = _unknown(runtime, reviewer, "a")
    accepted = _unknown(runtime, reviewer, "b")
    for command in (reconciled, accepted):
        occurrence_take(
            occurrence_id=command.occurrence_id, tenant_ids=[command.tenant_id], user=rita
        )

    command_reconcile(
        command_id=reconciled.pk,
        operator="sam",
        note="found it",
        outcome="committed",
        evidence="msg_1",
    )
    command_accept_ambiguity(command_id=accepted.pk, operator="rita.ops", note="accepted")

    for command in (reconciled, accepted):
        assert take_holder(occurrence_id=command.occurrence_id)[0] is None
    released = events(AuditKind.OPERATIONS_RELEASED)
    assert [(e.occurrence_id, e.reason_code, e.data["holder"]) for e in released] == [
        (reconciled.occurrence_id, EventReason.RESOLVED, "Rita"),
        (accepted.occurrence_id, EventReason.RESOLVED, "Rita"),
    ]
    assert released[0].actor == "sam", "the one whose decision resolved it"


def test_a_decision_on_an_item_nobody_holds_writes_no_release(
    runtime: Runtime, reviewer: Any
) -> None:
    command = _unknown(runtime, reviewer, "a")
    command_reconcile(
        command_id=command.pk, operator="sam", note="n", outcome="committed", evidence="e"
    )
    assert events(AuditKind.OPERATIONS_RELEASED) == []


def test_another_tenants_operator_cannot_take_or_let_go(
    runtime: Runtime, reviewer: Any, rita: Any, other_tenant: Tenant
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    take(rita, item)
    stranger = make_user("sly", other_tenant, Membership.Role.OPERATOR)

    for call in (
        lambda: occurrence_take(
            occurrence_id=item.occurrence_id, tenant_ids=[other_tenant.pk], user=stranger
        ),
        lambda: occurrence_release(
            occurrence_id=item.occurrence_id, tenant_ids=[other_tenant.pk], user=stranger
        ),
    ):
        refused = refusal_of(call)
        assert refused.status == 404 and refused.code == ErrorCode.NOT_FOUND

    web = client_of(stranger)
    for move in ("take", "release"):
        response = web.post(f"/operations/occurrences/{item.occurrence_id}/{move}")
        assert response.status_code == 404
    assert QueueTake.objects.get(occurrence_id=item.occurrence_id).holder_id == rita.pk
    assert str(item.occurrence_id) not in client_of(stranger).get("/operations/").content.decode()


# --- the pages ----------------------------------------------------------------------------


def test_only_operators_take(runtime: Runtime, reviewer: Any, admin_user: Any) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    for user in (reviewer, admin_user):
        response = client_of(user).post(f"/operations/occurrences/{item.occurrence_id}/take")
        assert response.status_code == 403
    assert not QueueTake.objects.filter(holder__isnull=False).exists()


def test_a_take_without_the_csrf_token_is_refused(
    runtime: Runtime, reviewer: Any, rita: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    strict = client_of(rita, enforce_csrf_checks=True)

    response = strict.post(f"/operations/occurrences/{item.occurrence_id}/take")

    assert response.status_code == 403
    assert not QueueTake.objects.filter(holder__isnull=False).exists()
    # With the page's token it goes through.
    page = strict.get(f"/operations/occurrences/{item.occurrence_id}/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    ok = strict.post(
        f"/operations/occurrences/{item.occurrence_id}/take",
        {"csrfmiddlewaretoken": token.group(1)},
    )
    assert ok.status_code == 302
    assert QueueTake.objects.get(occurrence_id=item.occurrence_id).holder_id == rita.pk


def test_take_and_let_go_answer_with_a_redirect_and_only_get_is_not_allowed(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    timeline = f"/operations/occurrences/{item.occurrence_id}/"
    web = client_of(rita)
    assert web.get(f"{timeline}take").status_code == 405
    assert web.post(f"{timeline}grab").status_code == 404

    taken = web.post(f"{timeline}take")
    assert (taken.status_code, taken["Location"]) == (302, timeline)
    page = web.get(timeline).content.decode()
    assert "You are on it" in page and 'id="take-release"' in page

    other = client_of(sam)
    refused = other.post(f"{timeline}take")
    assert (refused.status_code, refused["Location"]) == (302, timeline)
    shown = other.get(timeline).content.decode()
    assert re.search(r'id="operator-notice"[^>]*>Rita is on it since', shown)
    assert "Rita is on it · " in shown and 'id="take-over"' in shown
    # A take-over needs the confirmation; the form names the holder.
    assert f'name="take_over" value="{rita.pk}"' in shown
    unconfirmed = other.post(f"{timeline}take", {"take_over": rita.pk})
    assert unconfirmed.status_code == 302
    assert QueueTake.objects.get(occurrence_id=item.occurrence_id).holder_id == rita.pk
    other.post(f"{timeline}take", {"take_over": rita.pk, "confirm": "yes"})
    assert QueueTake.objects.get(occurrence_id=item.occurrence_id).holder_id == sam.pk

    # From the queue, the answer leads back to the queue with its filters.
    back = "/operations/?owner=mine&sort=age&dir=asc"
    let_go = other.post(f"{timeline}release", {"back": back})
    assert (let_go.status_code, let_go["Location"]) == (302, back)
    elsewhere = web.post(f"{timeline}take", {"back": "https://evil.example/operations/"})
    assert elsewhere["Location"] == timeline


def test_the_queue_row_says_who_is_on_it(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any
) -> None:
    item = expired(runtime, reviewer, "pay_1", minutes_ago=10)
    take(rita, item)
    QueueTake.objects.filter(occurrence_id=item.occurrence_id).update(
        taken_at=db_now() - timedelta(minutes=5)
    )

    for viewer, words in ((sam, "Rita is on it · 5 min"), (rita, "You are on it · 5 min")):
        page = client_of(viewer).get("/operations/").content.decode()
        row = page[page.index(f'data-item="{key(item)}"') :].split("</tr>")[0]
        assert words in row
    sams = client_of(sam).get("/operations/").content.decode()
    sams_row = sams[sams.index(f'data-item="{key(item)}"') :].split("</tr>")[0]
    assert "I\u2019m on it" not in sams_row and "Let go" not in sams_row


def test_the_owner_filter_lists_mine_or_unowned_and_keeps_the_other_filters(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any
) -> None:
    mine = expired(runtime, reviewer, "pay_1", minutes_ago=30)
    sams = expired(runtime, reviewer, "pay_2", minutes_ago=20)
    free = expired(runtime, reviewer, "pay_3", minutes_ago=10)
    take(rita, mine)
    take(sam, sams)
    web = client_of(rita)

    assert listed(web) == [key(mine), key(sams), key(free)]
    assert listed(web, "?owner=mine") == [key(mine)]
    assert listed(web, "?owner=unowned") == [key(free)]
    assert listed(client_of(sam), "?owner=mine") == [key(sams)]
    assert listed(web, "?owner=nonsense") == [key(mine), key(sams), key(free)]
    assert listed(web, "?owner=unowned&q=pay_1") == []
    assert listed(web, "?owner=mine&q=pay_1&reason=expired_unclaimed&tool=issue_refund") == [
        key(mine)
    ]
    page = web.get("/operations/?owner=mine&tool=issue_refund").content.decode()
    assert '<option value="mine" selected>' in page
    assert "<strong>1</strong> approval expired unclaimed" in page, "the counts are filtered"
    # The counts' links, the sort links and the poll carry the filter.
    assert 'href="?reason=expired_unclaimed&amp;tool=issue_refund&amp;owner=mine"' in page
    assert re.search(
        r'class="sort" href="/operations/\?tool=issue_refund&amp;owner=mine&amp;sort=', page
    )
    assert 'hx-get="/operations/?tool=issue_refund&amp;owner=mine&amp;sort=age&amp;dir=asc"' in page
    empty = web.get("/operations/?owner=mine&q=pay_3").content.decode()
    assert "Nothing needs a person for “pay_3” for these filters" in empty


def test_queries_per_queue_page_stay_constant_with_owners(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any
) -> None:
    web = client_of(rita)
    first = expired(runtime, reviewer, "pay_0", minutes_ago=50)
    take(sam, first)
    for query in ("", "?owner=mine", "?owner=unowned"):
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as few:
            assert web.get(f"/operations/{query}").status_code == 200
        for n in range(1, 4):
            more = expired(runtime, reviewer, f"pay_{query[-4:]}{n}", minutes_ago=40 - n)
            if n < 3:  # the last stays unowned
                take(rita if n % 2 else sam, more)
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as many:
            page = web.get(f"/operations/{query}").content.decode()
        assert len(many) == len(few), query
        assert ("sam is on it" in page) == (query == ""), query


def test_the_owner_filter_answers_as_its_orm_twin(
    runtime: Runtime, reviewer: Any, rita: Any, sam: Any
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the SQL reads run on PostgreSQL only")
    items = [expired(runtime, reviewer, f"pay_{n}", minutes_ago=50 - n) for n in range(4)]
    take(rita, items[0])
    take(sam, items[1])
    take(rita, items[2])
    QueueTake.objects.filter(occurrence_id=items[2].occurrence_id).update(
        expires_at=db_now() - timedelta(seconds=1)
    )
    tenant_ids = [runtime.key.tenant_id]
    now = timezone.now()
    for owner in (None, Owner(Owner.MINE, rita.pk), Owner(Owner.UNOWNED, rita.pk)):
        read = queue_items(tenant_ids=tenant_ids, now=now, owner=owner)
        counts = queue_counts(tenant_ids=tenant_ids, now=now, owner=owner)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(queue_selectors, "on_postgresql", lambda: False)
            twin = queue_items(tenant_ids=tenant_ids, now=now, owner=owner)
            twin_counts = queue_counts(tenant_ids=tenant_ids, now=now, owner=owner)
        assert [(i.key, i.holder) for i in read] == [(i.key, i.holder) for i in twin], owner
        assert counts == twin_counts, owner
    mine = queue_items(tenant_ids=tenant_ids, now=now, owner=Owner(Owner.MINE, rita.pk))
    assert [i.key for i in mine] == [key(items[0])], "the lapsed take is nobody's"
    unowned = queue_items(tenant_ids=tenant_ids, now=now, owner=Owner(Owner.UNOWNED, rita.pk))
    assert [i.key for i in unowned] == [key(items[2]), key(items[3])]
