"""Issue 26, notifications: a request routed to a group reaches its reviewers by e-mail (a
real SMTP server, aiosmtpd), its Slack incoming webhook and its generic webhook (a real
HTTP receiver; Standard Webhooks signatures checked by the ``standardwebhooks`` package),
through the outbox written with the request and the same attempt/backoff mechanism as
callbacks; reviewers choose every request, a digest or nothing, and quiet hours; sensitive
arguments never leave the console; escalation tells the fallback group; the decision is
told to Slack again."""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from standardwebhooks import Webhook

from approvals.models import (
    Channel,
    NotificationAttempt,
    NotificationDelivery,
    NotificationEvent,
    NotificationPreference,
    Occurrence,
    ReviewerGroup,
    Tenant,
    ToolContract,
)
from approvals.notifications.delivery import deliver, deliveries_due, digests_send
from approvals.notifications.fanout import fan_out
from approvals.notifications.preferences import preference_save, quiet_until
from approvals.reviews.deadlines import occurrence_escalate
from approvals.reviews.decisions import occurrence_reject
from approvals.routing.changes import reviewer_group_save, routing_rule_save
from tests.approvals import smtp_fixture
from tests.approvals.smtp_fixture import Mailbox, parts
from tests.approvals.test_callbacks import Receiver, receiver
from tests.conftest import REFUND_ARGS, Runtime

smtp = smtp_fixture.smtp
__all__ = ["receiver"]  # the callbacks' HTTP receiver, reused as Slack and the webhook


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    settings.NOTIFY_RETRY_BACKOFF_SECONDS = 2.0
    settings.CONSOLE_BASE_URL = "https://console.example"


def refund(amount: int, **extra: Any) -> dict[str, Any]:
    return {**REFUND_ARGS, "amount_minor": amount, "currency": "EUR", **extra}


class Setup:
    def __init__(self, tenant: Tenant, admin: Any, rita: Any, ravi: Any, url: str) -> None:
        for user, address in ((rita, "rita@acme.test"), (ravi, "ravi@acme.test")):
            user.email = address
            user.save(update_fields=["email"])
        self.support = reviewer_group_save(
            tenant=tenant, admin=admin, name="support", member_ids=[rita.pk]
        ).group
        saved = reviewer_group_save(
            tenant=tenant,
            admin=admin,
            name="finance-leads",
            member_ids=[ravi.pk],
            slack_webhook_url=url + "/slack",
            webhook_url=url + "/hook",
        )
        self.leads, self.secret = saved.group, saved.secret
        routing_rule_save(
            tenant=tenant,
            admin=admin,
            tool="issue_refund",
            name="refunds",
            group_ids=[self.support.pk],
            fallback_group_id=self.leads.pk,
        )
        routing_rule_save(
            tenant=tenant,
            admin=admin,
            tool="issue_refund",
            name="large refunds",
            group_ids=[self.leads.pk],
            currency="EUR",
            amount_over_minor=50000,
        )


@pytest.fixture
def routed(
    tenant: Tenant, admin_user: Any, reviewer: Any, second_reviewer: Any, receiver: Receiver
) -> Setup:
    return Setup(tenant, admin_user, reviewer, second_reviewer, receiver.url)


def drain() -> list[str]:
    """What the worker does: fan out every event, then send every due delivery once."""
    for event_id in NotificationEvent.objects.filter(fanned_out_at__isnull=True).values_list(
        "pk", flat=True
    ):
        fan_out(event_id)
    return [
        deliver(str(pk)).outcome
        for pk in NotificationDelivery.objects.filter(
            state=NotificationDelivery.State.PENDING,
            held=False,
            next_attempt_at__lte=timezone.now(),
        ).values_list("pk", flat=True)
    ]


def propose(runtime: Runtime, amount: int, ref: str, **extra: Any) -> str:
    answer = runtime.propose(arguments=refund(amount, **extra), client_ref=ref)
    assert answer.status_code == 201, answer.content
    return str(answer.json()["occurrence_id"])


# The callbacks' receiver keeps no path; both URLs of a group differ by it, so the tests
# tell Slack's messages from the webhook's by their bodies.
def slack_messages(receiver: Receiver) -> list[str]:
    return [json.loads(b)["text"] for _, b in receiver.received if "text" in json.loads(b)]


def webhook_deliveries(receiver: Receiver) -> list[tuple[dict[str, str], bytes]]:
    return [(h, b) for h, b in receiver.received if "webhook-id" in h]


def test_a_large_refund_reaches_finance_leads_by_mail_slack_and_signed_webhook(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver
) -> None:
    occurrence_id = propose(runtime, 90000, "big")

    assert sorted(drain()) == ["delivered"] * 3  # e-mail, Slack, webhook

    (mail,) = smtp.messages
    assert mail["To"] == "ravi@acme.test"
    text, html = parts(mail)
    link = f"https://console.example/reviews/{occurrence_id}/"
    assert link in text and f'href="{link}"' in html
    assert "EUR 900.00" in text and "EUR 900.00" in html
    digest = Occurrence.objects.get(pk=occurrence_id).proposals.get().action_digest
    assert digest[:12] in text and digest not in text  # its first 12 characters only
    assert "tok_" not in text + html  # never a token

    (slack,) = slack_messages(receiver)
    assert "issue_refund" in slack and "EUR 900.00" in slack and digest[:12] in slack
    assert f"<{link}|" in slack

    ((headers, body),) = webhook_deliveries(receiver)
    sent = Webhook(routed.secret).verify(body, headers)
    assert sent["type"] == "review.requested" and sent["data"]["occurrence_id"] == occurrence_id
    assert sent["data"]["amount"] == "EUR 900.00" and sent["group"] == "finance-leads"
    # support (rita) hears nothing of it: the band routed it to finance-leads alone.
    assert smtp.to("rita@acme.test") == []


def test_a_small_refund_mails_support_only(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver
) -> None:
    propose(runtime, 1000, "small")
    assert drain() == ["delivered"]
    assert [m["To"] for m in smtp.messages] == ["rita@acme.test"]
    assert receiver.received == []  # support has no Slack nor webhook


def test_sensitive_arguments_never_leave_the_console(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver
) -> None:
    ToolContract.objects.filter(name="issue_refund").update(
        sensitive_arguments=["reason", "payment_id"]
    )
    propose(runtime, 90000, "secret", reason="Customer IBAN DE89370400440532013000")
    drain()
    text, html = parts(smtp.messages[0])
    sent = [text, html, *slack_messages(receiver), *(b.decode() for _, b in receiver.received)]
    for what in sent:
        assert "DE89370400440532013000" not in what and "pay_123" not in what
    assert "2 sensitive arguments not shown" in text


def test_a_failing_channel_is_retried_with_backoff_every_attempt_recorded_and_shown(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver, admin_user: Any
) -> None:
    from tests.approvals.test_views_html import signed_in

    receiver.statuses = [500, 500]  # Slack, then the webhook, fail once each (in some order)
    propose(runtime, 90000, "flaky")
    outcomes = drain()
    assert sorted(outcomes) == ["delivered", "retry", "retry"]
    failing = NotificationDelivery.objects.filter(state="pending", attempts=1)
    assert failing.count() == 2
    first = failing.first()
    assert first is not None and first.next_attempt_at > timezone.now() + timedelta(seconds=1)
    page = signed_in(admin_user).get("/manage/routing/").content.decode()
    assert "failing-channels" in page and "HTTP 500" in page
    # Due again (the backoff passed): delivered, two attempts recorded each.
    NotificationDelivery.objects.filter(state="pending").update(next_attempt_at=timezone.now())
    assert deliveries_due() == []  # the sweep leaves them to their tasks for a grace period
    assert sorted(drain()) == ["delivered", "delivered"]
    codes = NotificationAttempt.objects.filter(
        delivery__channel__in=["slack", "webhook"]
    ).values_list("status_code", flat=True)
    assert sorted(c or 0 for c in codes) == [204, 204, 500, 500]


def test_escalation_tells_the_fallback_group_and_a_decision_tells_slack_again(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver, reviewer: Any
) -> None:
    occurrence_id = propose(runtime, 1000, "late")
    drain()
    Occurrence.objects.filter(pk=occurrence_id).update(
        review_deadline_at=timezone.now() - timedelta(minutes=1)
    )
    assert occurrence_escalate(occurrence_id)
    drain()
    assert [m["To"] for m in smtp.messages] == ["rita@acme.test", "ravi@acme.test"]
    assert "Escalated" in str(smtp.messages[1]["Subject"])
    (slack,) = slack_messages(receiver)
    assert "Escalated" in slack

    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason="No."
    )
    drain()
    # The decision is told to the routed group's channels (support has none): no mail.
    assert len(smtp.messages) == 2 and len(slack_messages(receiver)) == 1


def test_the_decision_is_told_to_the_routed_groups_slack(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver, reviewer: Any
) -> None:
    occurrence_id = propose(runtime, 90000, "decided")
    drain()
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason="No."
    )
    drain()
    first, second = slack_messages(receiver)
    assert "Review requested" in first and "Decided: rejected" in second
    assert f"Decided by {reviewer.get_username()}" in second and "rejecting: No." in second
    assert len(smtp.messages) == 1  # nobody is mailed the outcome
    # The generic webhook's data carries the same two facts (fields added, none changed).
    decided = [json.loads(b)["data"] for _, b in webhook_deliveries(receiver)][-1]
    assert decided["event"] == "decided" and decided["outcome"] == "rejected"
    assert (decided["decided_by"], decided["rejection_reason"]) == (reviewer.get_username(), "No.")


def test_preferences_none_digest_and_quiet_hours(
    runtime: Runtime, routed: Setup, smtp: Mailbox, second_reviewer: Any
) -> None:
    preference_save(user_id=second_reviewer.pk, channel=Channel.EMAIL, mode="none")
    propose(runtime, 90000, "a")
    drain()
    assert smtp.to("ravi@acme.test") == []

    preference_save(
        user_id=second_reviewer.pk, channel=Channel.EMAIL, mode="digest", digest_minutes=30
    )
    propose(runtime, 91000, "b")
    propose(runtime, 92000, "c")
    drain()
    assert smtp.to("ravi@acme.test") == []  # held for the digest
    (digest_id,) = digests_send()
    assert deliver(digest_id).outcome == "delivered"
    (mail,) = smtp.to("ravi@acme.test")
    text, _ = parts(mail)
    assert "2 request(s)" in str(mail["Subject"]) and "EUR 910.00" in text and "EUR 920.00" in text
    assert digests_send() == []  # nothing held; and the period has not passed
    propose(runtime, 93000, "d")
    drain()
    assert digests_send() == []  # held until 30 minutes after the last digest
    later = timezone.now() + timedelta(minutes=31)
    assert len(digests_send(now=later)) == 1

    # Quiet hours around now, in the reviewer's time zone: deferred to their end.
    preference_save(
        user_id=second_reviewer.pk,
        channel=Channel.EMAIL,
        mode="every",
        time_zone="Asia/Tokyo",
        quiet_start=(timezone.now() - timedelta(hours=1)).astimezone(_tokyo()).strftime("%H:%M"),
        quiet_end=(timezone.now() + timedelta(hours=1)).astimezone(_tokyo()).strftime("%H:%M"),
    )
    propose(runtime, 94000, "e")
    drain()
    deferred = NotificationDelivery.objects.get(
        channel=Channel.EMAIL, event__occurrence__client_ref="e"
    )
    assert deferred.state == "pending" and deferred.attempts == 0
    assert deferred.next_attempt_at > timezone.now() + timedelta(minutes=55)
    assert str(deferred.pk) not in deliveries_due()
    NotificationDelivery.objects.filter(pk=deferred.pk).update(
        next_attempt_at=timezone.now() - timedelta(minutes=1)
    )
    assert str(deferred.pk) in deliveries_due()  # the sweep sends it once they are over


def _tokyo() -> Any:
    from zoneinfo import ZoneInfo

    return ZoneInfo("Asia/Tokyo")


@pytest.mark.parametrize(
    ("start", "end", "now_local", "until_local"),
    [
        (time(22), time(7), datetime(2026, 3, 1, 23, 30), datetime(2026, 3, 2, 7)),
        (time(22), time(7), datetime(2026, 3, 2, 6, 59), datetime(2026, 3, 2, 7)),
        (time(22), time(7), datetime(2026, 3, 2, 7, 0), None),
        (time(12), time(13), datetime(2026, 3, 2, 12, 15), datetime(2026, 3, 2, 13)),
        (time(12), time(13), datetime(2026, 3, 2, 11, 59), None),
    ],
)
def test_quiet_hours_are_read_in_the_reviewers_time_zone(
    start: time, end: time, now_local: datetime, until_local: datetime | None
) -> None:
    zone = _tokyo()
    pref = NotificationPreference(
        channel=Channel.EMAIL, time_zone="Asia/Tokyo", quiet_start=start, quiet_end=end
    )
    now = now_local.replace(tzinfo=zone).astimezone(UTC)
    expected = until_local.replace(tzinfo=zone).astimezone(UTC) if until_local else None
    assert quiet_until(pref, now) == expected


def test_the_header_counts_unread_notifications_until_the_request_is_opened(
    runtime: Runtime, routed: Setup, smtp: Mailbox, second_reviewer: Any
) -> None:
    from tests.approvals.test_views_html import parse, signed_in

    client = signed_in(second_reviewer)
    assert b"unread-count" not in client.get("/reviews/").content
    first = propose(runtime, 90000, "one")
    propose(runtime, 95000, "two")
    drain()
    assert parse(client.get("/reviews/")).text("unread-count") == "2"
    assert client.get(f"/reviews/{first}/").status_code == 200
    assert parse(client.get("/reviews/")).text("unread-count") == "1"
    assert client.post("/account/notifications/read").status_code == 302
    assert b"unread-count" not in client.get("/reviews/").content


def test_a_reviewer_saves_preferences_on_her_page(second_reviewer: Any) -> None:
    from tests.approvals.test_views_html import signed_in

    client = signed_in(second_reviewer)
    assert client.get("/account/notifications/").status_code == 200
    saved = client.post(
        "/account/notifications/save",
        {
            "channel": "email",
            "mode": "digest",
            "digest_minutes": "15",
            "time_zone": "Europe/Paris",
            "quiet_start": "22:00",
            "quiet_end": "07:00",
        },
    )
    assert saved.status_code == 302
    pref = NotificationPreference.objects.get(user=second_reviewer, channel="email")
    assert (pref.mode, pref.digest_minutes, pref.time_zone) == ("digest", 15, "Europe/Paris")
    assert (pref.quiet_start, pref.quiet_end) == (time(22), time(7))
    for bad in (
        {"mode": "loud"},
        {"time_zone": "Mars/Olympus"},
        {"quiet_start": "25:00", "quiet_end": "07:00"},
        {"quiet_start": "22:00", "quiet_end": ""},
        {"channel": "console", "mode": "digest"},
    ):
        answer = client.post(
            "/account/notifications/save", {"channel": "email", "mode": "every", **bad}
        )
        assert answer.status_code == 422, bad
    assert NotificationPreference.objects.get(pk=pref.pk).mode == "digest"
    assert get_user_model().objects.count() == 1


def test_no_rule_mails_every_reviewer_of_the_tenant(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, smtp: Mailbox
) -> None:
    for user in (reviewer, second_reviewer):
        user.email = f"{user.username}@acme.test"
        user.save(update_fields=["email"])
    propose(runtime, 1000, "unrouted")
    assert drain() == ["delivered", "delivered"]
    assert sorted(str(m["To"]) for m in smtp.messages) == ["ravi@acme.test", "rita@acme.test"]
    assert not ReviewerGroup.objects.exists()


def test_the_demo_outbox_shows_what_was_sent_under_debug_only(
    runtime: Runtime, routed: Setup, second_reviewer: Any, settings: Any, tmp_path: Any
) -> None:
    from django.test import Client

    from tests.approvals.test_views_html import signed_in

    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path)
    client = signed_in(second_reviewer)
    settings.DEBUG = False
    assert client.get("/_demo/outbox").status_code == 404
    assert Client().post("/_demo/outbox/catch/slack", "{}", "application/json").status_code == 404

    settings.DEBUG = True
    ReviewerGroup.objects.filter(pk=routed.leads.pk).update(
        webhook_url="", slack_webhook_encrypted=""
    )
    propose(runtime, 90000, "demo")
    assert drain() == ["delivered"]
    caught = Client().post(
        "/_demo/outbox/catch/slack", json.dumps({"text": "*Review requested*"}), "application/json"
    )
    assert caught.status_code == 204  # a receiver: no CSRF token, as Slack's has none
    page = client.get("/_demo/outbox").content.decode()
    assert "Review requested: issue_refund · EUR 900.00" in page
    assert "ravi@acme.test" in page and "*Review requested*" in page


# --- a real worker ------------------------------------------------------------------------------

from django.db import connection  # noqa: E402

from tests.approvals.test_callbacks import broker, sandbox_server, workers  # noqa: E402
from tests.demo.sandbox_fixture import SandboxProcess  # noqa: E402
from tests.reconciliation.worker_fixture import Broker, Workers, wait_until  # noqa: E402

__all__ += ["broker", "sandbox_server", "workers"]


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a real worker shares PostgreSQL")
def test_a_real_worker_mails_and_posts_from_the_outbox_and_retries(
    runtime: Runtime,
    routed: Setup,
    smtp: Mailbox,
    receiver: Receiver,
    broker: Broker,
    workers: Workers,
    sandbox_server: SandboxProcess,
) -> None:
    receiver.statuses = [503]  # the first POST fails: retried with backoff by the worker
    workers.start(
        sandbox_server,
        CALLBACK_ALLOW_HTTP=1,
        CALLBACK_ALLOW_PRIVATE_HOSTS=1,
        NOTIFY_RETRY_BACKOFF_SECONDS=0.2,
        EMAIL_HOST=smtp.host,
        EMAIL_PORT=smtp.port,
        CONSOLE_BASE_URL="https://console.example",
    )
    occurrence_id = propose(runtime, 90000, "worker")

    (mail,) = smtp.wait_for(1)
    assert mail["To"] == "ravi@acme.test"
    assert f"https://console.example/reviews/{occurrence_id}/" in parts(mail)[0]
    wait_until(
        "Slack and the webhook to be delivered",
        lambda: (
            NotificationDelivery.objects.filter(
                channel__in=["slack", "webhook"], state="delivered"
            ).count()
            == 2
        ),
        timeout=60,
    )
    # One message, sent again as it was when its first POST failed (the receiver keeps both).
    assert len(set(slack_messages(receiver))) == 1
    ((headers, body),) = webhook_deliveries(receiver)[-1:]
    assert Webhook(routed.secret).verify(body, headers)["data"]["occurrence_id"] == occurrence_id
    statuses = sorted(
        c or 0
        for c in NotificationAttempt.objects.exclude(status_code=None).values_list(
            "status_code", flat=True
        )
    )
    assert statuses == [204, 204, 503]


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a real worker shares PostgreSQL")
def test_a_real_beat_sends_the_digest_of_what_was_held(
    runtime: Runtime,
    routed: Setup,
    smtp: Mailbox,
    second_reviewer: Any,
    broker: Broker,
    workers: Workers,
    sandbox_server: SandboxProcess,
) -> None:
    preference_save(
        user_id=second_reviewer.pk, channel=Channel.EMAIL, mode="digest", digest_minutes=60
    )
    env: dict[str, Any] = {
        "CALLBACK_ALLOW_HTTP": 1,
        "CALLBACK_ALLOW_PRIVATE_HOSTS": 1,
        "EMAIL_HOST": smtp.host,
        "EMAIL_PORT": smtp.port,
        "NOTIFY_DIGEST_SWEEP_SECONDS": 0.5,
    }
    workers.start(sandbox_server, **env)
    propose(runtime, 90000, "held-1")
    propose(runtime, 95000, "held-2")
    wait_until(
        "both to be held for the digest",
        lambda: NotificationDelivery.objects.filter(channel="email", held=True).count() == 2,
        timeout=60,
    )
    assert smtp.messages == []
    workers.start_beat(sandbox_server, **env)

    (mail,) = smtp.wait_for(1)
    text, _ = parts(mail)
    assert mail["To"] == "ravi@acme.test" and "EUR 900.00" in text and "EUR 950.00" in text
    assert (
        NotificationDelivery.objects.filter(channel="email", held=True, state="delivered").count()
        == 2
    )
