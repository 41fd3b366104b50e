"""Issue 26's drain: a request's fan-out task sends a small audience's notifications itself
(no ``deliver`` message each), each row still leased (written leased) and its attempt
recorded; a larger audience and every retry are published as before; the fan-out reads the
request and its route in few statements (counted); e-mail reuses one SMTP connection per
process and reopens it once when the server dropped it; the requester is not told of their
own request."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import broker
from approvals.models import (
    Channel,
    NotificationAttempt,
    NotificationDelivery,
    NotificationEvent,
)
from approvals.notifications import mailer
from approvals.notifications.delivery import deliveries_due, event_dispatch
from approvals.notifications.fanout import fan_out_rows
from approvals.notifications.tasks import notification_fan_out
from approvals.outbound import outbox
from approvals.outbound.outbox import LEASE, attempt_leased
from tests.approvals import smtp_fixture
from tests.approvals.smtp_fixture import Mailbox
from tests.approvals.test_callbacks import Receiver, receiver
from tests.approvals.test_notifications import (
    Setup,
    loopback_allowed,
    propose,
    refund,
    routed,
)
from tests.conftest import Runtime

smtp = smtp_fixture.smtp
__all__ = ["loopback_allowed", "receiver", "routed"]


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...], Any]]:
    """What the tasks publish (task name, arguments, countdown), instead of the broker."""
    sent: list[tuple[str, tuple[Any, ...], Any]] = []
    monkeypatch.setattr(
        broker,
        "publish",
        lambda task, args, countdown=None: sent.append((task.name, args, countdown)),
    )
    return sent


def event_of(occurrence_id: str) -> str:
    return str(NotificationEvent.objects.get(occurrence_id=occurrence_id).pk)


def test_a_small_audience_is_sent_by_its_fan_out_task_without_a_message_each(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver, published: list[Any]
) -> None:
    event = event_of(propose(runtime, 90000, "big"))  # ravi's e-mail, Slack, the webhook

    assert notification_fan_out(event) == 3

    assert published == []  # no deliver message: the fan-out task sent them
    assert [m["To"] for m in smtp.messages] == ["ravi@acme.test"]
    assert len(receiver.received) == 2
    sent = NotificationDelivery.objects.exclude(channel=Channel.CONSOLE)
    assert sorted(sent.values_list("channel", "state", "attempts", "leased_until")) == [
        ("email", "delivered", 1, None),
        ("slack", "delivered", 1, None),
        ("webhook", "delivered", 1, None),
    ]
    assert NotificationAttempt.objects.filter(error="", number=1).count() == 3
    assert notification_fan_out(event) == 0  # a redelivered fan-out sends nothing again
    assert len(smtp.messages) == 1


def test_a_larger_audience_is_published_a_delivery_each(
    runtime: Runtime,
    routed: Setup,
    smtp: Mailbox,
    published: list[Any],
    settings: Any,
) -> None:
    settings.NOTIFY_INLINE_DELIVERIES = 2
    event = event_of(propose(runtime, 90000, "big"))

    assert notification_fan_out(event) == 3

    assert sorted(name for name, _, _ in published) == ["approvals.notifications.deliver"] * 3
    assert smtp.messages == []
    # Free for their tasks: not leased, nothing attempted yet.
    due = NotificationDelivery.objects.exclude(channel=Channel.CONSOLE)
    assert set(due.values_list("state", "attempts", "leased_until")) == {("pending", 0, None)}


def test_a_failed_inline_send_is_recorded_and_its_retry_published_with_backoff(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver, published: list[Any]
) -> None:
    receiver.statuses = [500, 500]  # Slack and the webhook fail once each
    event = event_of(propose(runtime, 90000, "flaky"))

    notification_fan_out(event)

    retries = sorted(published)
    assert [(name, countdown) for name, _, countdown in retries] == [
        ("approvals.notifications.deliver", 2.0),
        ("approvals.notifications.deliver", 2.0),
    ]
    failing = NotificationDelivery.objects.filter(pk__in=[args[0] for _, args, _ in retries])
    assert set(failing.values_list("state", "attempts", "last_error", "leased_until")) == {
        ("pending", 1, "HTTP 500", None)
    }
    codes = NotificationAttempt.objects.values_list("status_code", flat=True)
    assert sorted(code or 0 for code in codes) == [0, 500, 500]  # the e-mail has no code


def test_rows_written_leased_are_the_fan_outs_until_the_lease_runs_out(
    runtime: Runtime, routed: Setup, smtp: Mailbox
) -> None:
    event = event_of(propose(runtime, 1000, "small"))  # rita's e-mail
    fanned = fan_out_rows(event, lease_up_to=5)
    (row,) = fanned.due
    assert fanned.leased and row.leased_until is not None
    # Due, but leased: the sweep leaves it to the task that wrote it.
    NotificationDelivery.objects.filter(pk=row.pk).update(
        next_attempt_at=timezone.now() - timedelta(minutes=5)
    )
    assert deliveries_due() == []

    # The task was slow: its lease ran out and the sweep leased the row in the meantime.
    expired = timezone.now() - timedelta(seconds=1)
    NotificationDelivery.objects.filter(pk=row.pk).update(leased_until=timezone.now() + LEASE)
    row.leased_until = expired
    outcome = attempt_leased(
        row=row, attempts=NotificationAttempt, send=_never, max_attempts=3, backoff_seconds=1
    )
    assert outcome.outcome == "skipped"
    assert not NotificationAttempt.objects.exists()


def _never(row: Any) -> Any:
    raise AssertionError("sent a row another holds")


def test_the_fan_out_and_its_inline_sends_count_their_statements(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver
) -> None:
    event = event_of(propose(runtime, 90000, "big"))
    with CaptureQueriesContext(connection) as queries:
        done = event_dispatch(event)
    assert len(done.sent) == 3
    # In a worker BEGIN and COMMIT stand where the test's transaction puts savepoints.
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    kinds = [s.split()[0] + " " + _table(s) for s in statements]
    assert kinds == [
        # The event (locked) with its occurrence, tool, tenant, rule version, fallback
        # group and current proposal: one query.
        "SELECT approvals_notificationevent",
        "SELECT approvals_reviewergroup",  # the route's groups
        "SELECT auth_user",  # their members, with their addresses
        "SELECT approvals_notificationpreference",
        "INSERT approvals_notificationdelivery",
        "UPDATE approvals_notificationevent",
        # Each delivery: its attempt's INSERT and its row's UPDATE as one statement (a
        # data-modifying WITH: no BEGIN, no COMMIT; SQLite runs the ORM twin's two in one
        # transaction); no lease, no re-read.
        *RECORD[connection.vendor] * 3,
    ], statements
    if connection.vendor == "postgresql":  # the row's UPDATE rides in each WITH
        assert all('UPDATE "approvals_notificationdelivery"' in s for s in statements[-3:])


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the SQL runs on PostgreSQL")
def test_an_attempts_record_in_one_statement_writes_what_its_orm_twin_writes(
    runtime: Runtime,
    routed: Setup,
    smtp: Mailbox,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def written(ref: str) -> list[tuple[Any, ...]]:
        receiver.statuses = [500]  # Slack fails (a retry), the webhook and the e-mail go
        event_dispatch(event_of(propose(runtime, 90000, ref)))
        found = []
        for row in NotificationDelivery.objects.filter(event__occurrence__client_ref=ref).exclude(
            channel=Channel.CONSOLE
        ):
            (attempt,) = row.attempt_log.all()
            found.append(
                (
                    row.channel,
                    row.state,
                    row.attempts,
                    row.leased_until,
                    row.last_error,
                    row.delivered_at == attempt.finished_at if row.delivered_at else None,
                    (row.next_attempt_at - attempt.finished_at).total_seconds(),
                    (attempt.number, attempt.status_code, attempt.error),
                    attempt.started_at <= attempt.finished_at,
                )
            )
        return sorted(found, key=str)

    by_sql = written("sql")
    monkeypatch.setattr(outbox, "_record_sql", outbox._record_orm)
    by_orm = written("orm")
    assert by_sql == by_orm
    assert [(c, st) for c, st, *_ in by_sql] == [
        ("email", "delivered"),
        ("slack", "pending"),
        ("webhook", "delivered"),
    ]


RECORD = {
    "postgresql": ["WITH approvals_notificationattempt"],
    "sqlite": ["INSERT approvals_notificationattempt", "UPDATE approvals_notificationdelivery"],
}


def _table(sql: str) -> str:
    """The statement's own table (a subquery's is aliased U0, U1 ...)."""
    found = re.search(r'(?:FROM|INTO|UPDATE) "(\w+)"(?! U\d)', sql)
    return found.group(1) if found else ""


def test_e_mails_share_one_smtp_connection_reopened_once_when_the_server_dropped_it(
    runtime: Runtime, routed: Setup, smtp: Mailbox, published: list[Any]
) -> None:
    mailer.close()
    for ref in ("a", "b", "c"):
        notification_fan_out(event_of(propose(runtime, 1000, ref)))  # rita's e-mail each
    assert len(smtp.messages) == 3
    assert len(set(smtp.peers)) == 1  # one connection for the three

    smtp.restart()  # the server went away and came back: the held connection is dead
    notification_fan_out(event_of(propose(runtime, 1000, "d")))

    assert len(smtp.messages) == 4 and smtp.peers[3] != smtp.peers[0]
    mail = NotificationDelivery.objects.get(event__occurrence__client_ref="d", channel="email")
    assert (mail.state, mail.attempts) == ("delivered", 1)
    assert list(mail.attempt_log.values_list("error", flat=True)) == [""]
    assert published == []
    mailer.close()


def test_the_requester_is_not_told_of_their_own_request(
    runtime: Runtime, routed: Setup, smtp: Mailbox, published: list[Any]
) -> None:
    # rita asks for a small refund (routed to support: rita alone), under her e-mail
    # address and spelled as self-approval would still recognise her.
    for ref, name in (("own-1", "rita@acme.test"), ("own-2", " Rita")):
        answer = runtime.propose(arguments=refund(1000), client_ref=ref, requested_by=name)
        assert answer.status_code == 201, answer.content
        notification_fan_out(event_of(str(answer.json()["occurrence_id"])))
    assert smtp.messages == []
    assert not NotificationDelivery.objects.filter(user__username="rita").exists()

    # Someone else's request still reaches her.
    answer = runtime.propose(arguments=refund(1000), client_ref="other", requested_by="ravi")
    notification_fan_out(event_of(str(answer.json()["occurrence_id"])))
    assert [m["To"] for m in smtp.messages] == ["rita@acme.test"]
