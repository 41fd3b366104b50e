"""Issue 26, a group's Slack app: the request's message posted with Slack's Web API
(``chat.postMessage``, a bot token) records Slack's ``ts``, and the decision (and the
escalation) is posted as a reply in that thread (``thread_ts``). A local HTTP receiver
plays Slack's Web API: it checks the bearer token, keeps every request and answers
``{"ok": true, "ts": …}`` or a scripted error. The token is never logged nor stored in
the clear. The admin page and the demo: ``test_slack_app_page.py``."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals.models import (
    AuditEvent,
    NotificationAttempt,
    NotificationDelivery,
    Occurrence,
    ReviewerGroup,
    Tenant,
)
from approvals.reviews.deadlines import occurrence_escalate
from approvals.reviews.decisions import occurrence_reject
from approvals.routing.changes import group_secret_decrypt, reviewer_group_save, routing_rule_save
from tests.approvals.test_notifications import drain, propose, refund
from tests.conftest import Runtime

TOKEN = "xoxb-1111-2222-abcdefABCDEF0123"
CHANNEL = "C0123ABCD"


@dataclass
class SlackApi:
    """A real HTTP server on loopback playing Slack's Web API: ``chat.postMessage`` with
    the bearer ``token``; each answer the next scripted one (``(status, body, headers)``),
    else ok with a new ``ts``."""

    url: str = ""
    token: str = TOKEN
    answers: list[tuple[int, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    posts: list[dict[str, Any]] = field(default_factory=list)  # the accepted ones
    refused: list[str] = field(default_factory=list)  # why a request was refused
    lock: threading.Lock = field(default_factory=threading.Lock)

    def texts(self) -> list[str]:
        return [str(p["text"]) for p in self.posts]


@pytest.fixture
def slack_api(settings: Any) -> Iterator[SlackApi]:
    state = SlackApi()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with state.lock:
                status, answer, headers = self._answer(body)
            raw = json.dumps(answer).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _answer(self, body: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
            if self.path != "/api/chat.postMessage":
                state.refused.append(f"path {self.path}")
                return 404, {"ok": False, "error": "unknown_method"}, {}
            if self.headers.get("Authorization") != f"Bearer {state.token}":
                state.refused.append("token")
                return 200, {"ok": False, "error": "invalid_auth"}, {}
            if state.answers:
                return state.answers.pop(0)
            payload = json.loads(body)
            if not payload.get("channel") or not payload.get("text"):
                state.refused.append("no channel or text")
                return 200, {"ok": False, "error": "invalid_arguments"}, {}
            state.posts.append(payload)
            ts = f"1700000000.{len(state.posts):06d}"
            return 200, {"ok": True, "channel": payload["channel"], "ts": ts}, {}

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/api"
    settings.SLACK_API_URL = state.url
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    settings.NOTIFY_RETRY_BACKOFF_SECONDS = 2.0
    settings.CONSOLE_BASE_URL = "https://console.example"
    yield state
    server.shutdown()
    server.server_close()


class SlackWebhook:
    """Slack's incoming webhook, beside the app: the callbacks' receiver's way, kept here
    to serve within one test."""

    def __init__(self) -> None:
        self.url = ""
        self.received: list[tuple[dict[str, str], bytes]] = []

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append((dict(self.headers.items()), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{server.server_address[1]}/services/T/B/x"
        try:
            yield
        finally:
            server.shutdown()
            server.server_close()


class Groups:
    def __init__(self, tenant: Tenant, admin: Any, rita: Any, ravi: Any) -> None:
        self.support = reviewer_group_save(
            tenant=tenant, admin=admin, name="support", member_ids=[rita.pk]
        ).group
        self.leads = reviewer_group_save(
            tenant=tenant,
            admin=admin,
            name="finance-leads",
            member_ids=[ravi.pk],
            slack_bot_token=TOKEN,
            slack_channel_id=CHANNEL,
        ).group
        routing_rule_save(
            tenant=tenant,
            admin=admin,
            tool="issue_refund",
            name="refunds",
            group_ids=[self.leads.pk],
            fallback_group_id=self.leads.pk,
        )


@pytest.fixture
def groups(
    tenant: Tenant, admin_user: Any, reviewer: Any, second_reviewer: Any, slack_api: SlackApi
) -> Groups:
    return Groups(tenant, admin_user, reviewer, second_reviewer)


def app_deliveries() -> list[NotificationDelivery]:
    return list(NotificationDelivery.objects.filter(channel="slack_app").order_by("created_at"))


def reject(occurrence_id: str, reviewer: Any) -> None:
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason="No."
    )


# --- threading -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_decision_is_a_reply_in_the_request_messages_thread(
    runtime: Runtime, groups: Groups, slack_api: SlackApi, reviewer: Any
) -> None:
    occurrence_id = propose(runtime, 90000, "threaded")
    assert drain() == ["delivered"]  # ravi has no e-mail address: the app alone
    (request,) = slack_api.posts
    assert request["channel"] == CHANNEL and "thread_ts" not in request
    assert "Review requested: issue_refund · EUR 900.00" in request["text"]
    assert f"<https://console.example/reviews/{occurrence_id}/|" in request["text"]
    (parent,) = app_deliveries()
    assert (parent.slack_ts, parent.slack_channel) == ("1700000000.000001", CHANNEL)

    reject(occurrence_id, reviewer)
    assert drain() == ["delivered"]
    _, outcome = slack_api.posts
    assert outcome["thread_ts"] == parent.slack_ts and outcome["channel"] == CHANNEL
    assert outcome["text"].startswith("*Decided: rejected: issue_refund · EUR 900.00*")
    assert slack_api.refused == []


@pytest.mark.django_db
def test_the_decisions_reply_says_who_decided_and_why_in_slacks_escaping(
    runtime: Runtime, groups: Groups, slack_api: SlackApi, reviewer: Any
) -> None:
    occurrence_id = propose(runtime, 90000, "who-and-why")
    drain()
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id),
        reviewer=reviewer,
        reason="Ask <!channel> for a receipt & photos first",
    )
    drain()
    _, outcome = slack_api.posts
    lines = outcome["text"].splitlines()
    assert f"Decided by {reviewer.get_username()}" in lines
    # The reviewer's words cannot ping the channel or make a link: Slack's escaping.
    assert "Reason for rejecting: Ask &lt;!channel&gt; for a receipt &amp; photos first" in lines
    # The request's own message says neither (nobody had decided).
    assert "Decided by" not in slack_api.posts[0]["text"]


@pytest.mark.django_db
def test_the_escalation_and_the_timeout_reply_in_the_same_thread(
    runtime: Runtime, groups: Groups, slack_api: SlackApi
) -> None:
    from approvals.reviews.deadlines import occurrence_time_out

    occurrence_id = propose(runtime, 1000, "late")
    drain()
    Occurrence.objects.filter(pk=occurrence_id).update(
        review_deadline_at=timezone.now() - timedelta(minutes=1),
        final_deadline_at=timezone.now() - timedelta(seconds=1),
    )
    assert occurrence_escalate(occurrence_id)
    drain()
    assert occurrence_time_out(occurrence_id)
    drain()
    first, escalated, timed_out = slack_api.posts
    assert "thread_ts" not in first
    assert escalated["thread_ts"] == timed_out["thread_ts"] == "1700000000.000001"
    assert "Escalated, nobody decided in time" in escalated["text"]
    assert "Decided: timed_out" in timed_out["text"]


@pytest.mark.django_db
def test_a_request_message_that_failed_leaves_the_outcome_a_plain_message_saying_so(
    runtime: Runtime, groups: Groups, slack_api: SlackApi, reviewer: Any
) -> None:
    slack_api.answers = [(200, {"ok": False, "error": "channel_not_found"}, {})]
    occurrence_id = propose(runtime, 90000, "lost")
    assert drain() == ["failed"]  # given up at once: no later attempt finds the channel
    (parent,) = app_deliveries()
    assert parent.state == "failed" and parent.attempts == 1 and parent.slack_ts == ""
    assert parent.last_error == "Slack: channel_not_found"

    reject(occurrence_id, reviewer)
    assert drain() == ["delivered"]
    (outcome,) = slack_api.posts
    assert "thread_ts" not in outcome
    assert outcome["text"].startswith("_The request's message could not be posted here")
    assert "Decided: rejected" in outcome["text"]


@pytest.mark.django_db
def test_the_outcome_waits_for_a_request_message_still_being_retried(
    runtime: Runtime, groups: Groups, slack_api: SlackApi, reviewer: Any
) -> None:
    slack_api.answers = [(200, {"ok": False, "error": "ratelimited"}, {})]
    occurrence_id = propose(runtime, 90000, "slow")
    assert drain() == ["retry"]
    reject(occurrence_id, reviewer)
    assert drain() == ["retry"]  # the reply waits: its parent has no ts yet
    parent, outcome = app_deliveries()
    assert outcome.last_error.startswith("waiting for the request's Slack message")
    assert slack_api.posts == []

    NotificationDelivery.objects.filter(pk=parent.pk).update(next_attempt_at=timezone.now())
    assert drain() == ["delivered"]
    NotificationDelivery.objects.filter(pk=outcome.pk).update(next_attempt_at=timezone.now())
    assert drain() == ["delivered"]
    _, second = slack_api.posts
    assert second["thread_ts"] == NotificationDelivery.objects.get(pk=parent.pk).slack_ts


@pytest.mark.django_db
def test_the_webhook_and_the_app_together_each_get_every_message(
    runtime: Runtime, groups: Groups, slack_api: SlackApi, reviewer: Any, admin_user: Any
) -> None:
    from tests.approvals.test_notifications import slack_messages

    hook = SlackWebhook()
    with hook.serving():
        reviewer_group_save(
            tenant=groups.leads.tenant,
            admin=admin_user,
            name="finance-leads",
            member_ids=[],
            slack_webhook_url=hook.url,
            group=groups.leads,
        )
        occurrence_id = propose(runtime, 90000, "both")
        drain()
        reject(occurrence_id, reviewer)
        drain()
    channels = NotificationDelivery.objects.filter(group__isnull=False).values_list(
        "channel", flat=True
    )
    assert sorted(channels) == ["slack", "slack", "slack_app", "slack_app"]
    assert len(slack_api.posts) == 2 and slack_api.posts[1]["thread_ts"]
    webhook_texts = slack_messages(hook)  # type: ignore[arg-type]
    assert "Review requested" in webhook_texts[0] and "Decided: rejected" in webhook_texts[1]


# --- ok=false and HTTP: give up or retry ----------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("answer", "outcome", "error"),
    [
        ((200, {"ok": False, "error": "invalid_auth"}, {}), "failed", "Slack: invalid_auth"),
        ((200, {"ok": False, "error": "not_in_channel"}, {}), "failed", "Slack: not_in_channel"),
        ((200, {"ok": False, "error": "ratelimited"}, {}), "retry", "Slack: ratelimited"),
        (
            (429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "30"}),
            "retry",
            "HTTP 429: rate limited (Retry-After 30 s)",
        ),
        ((200, {"ok": False, "error": "internal_error"}, {}), "retry", "Slack: internal_error"),
        ((503, {}, {}), "retry", "HTTP 503"),
    ],
)
def test_slacks_errors_give_up_or_retry(
    runtime: Runtime,
    groups: Groups,
    slack_api: SlackApi,
    answer: tuple[int, dict[str, Any], dict[str, str]],
    outcome: str,
    error: str,
) -> None:
    slack_api.answers = [answer]
    propose(runtime, 90000, "err")
    assert drain() == [outcome]
    (delivery,) = app_deliveries()
    assert delivery.last_error == error and delivery.slack_ts == ""
    assert delivery.state == ("failed" if outcome == "failed" else "pending")
    (attempt,) = NotificationAttempt.objects.filter(delivery=delivery)
    assert attempt.status_code == answer[0] and attempt.error == error


@pytest.mark.django_db
def test_a_wrong_token_is_refused_by_the_receiver_and_given_up(
    runtime: Runtime, groups: Groups, slack_api: SlackApi
) -> None:
    slack_api.token = "xoxb-someone-else-0000000000"
    propose(runtime, 90000, "wrong")
    assert drain() == ["failed"]
    assert slack_api.refused == ["token"] and slack_api.posts == []


@pytest.mark.django_db
def test_the_token_is_never_logged_nor_in_an_error(
    runtime: Runtime, groups: Groups, slack_api: SlackApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    slack_api.answers = [(200, {"ok": False, "error": "invalid_auth"}, {})]
    propose(runtime, 90000, "quiet")
    propose(runtime, 91000, "quiet-2")
    drain()
    assert len(slack_api.posts) == 1  # one refused, one posted
    stored = json.dumps(
        list(NotificationDelivery.objects.values("last_error", "body"))
        + list(NotificationAttempt.objects.values("error"))
        + list(AuditEvent.objects.values("data")),
        default=str,
    )
    for secret_part in (TOKEN, TOKEN[5:]):
        assert secret_part not in caplog.text and secret_part not in stored
        assert all(secret_part not in str(record.__dict__) for record in caplog.records)
    assert (
        group_secret_decrypt(
            ReviewerGroup.objects.get(name="finance-leads").slack_bot_token_encrypted
        )
        == TOKEN
    )
    assert TOKEN not in ReviewerGroup.objects.get(name="finance-leads").slack_bot_token_encrypted


@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the guarded reads as on a deployment"
)
def test_a_private_slack_api_address_is_refused_unless_allowed(
    runtime: Runtime, groups: Groups, slack_api: SlackApi, settings: Any
) -> None:
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = False
    propose(runtime, 90000, "private")
    assert drain() == ["retry"]
    (delivery,) = app_deliveries()
    assert "not a public address" in delivery.last_error and slack_api.posts == []


__all__ = ["refund"]


# --- a real worker ---------------------------------------------------------------------------

from tests.approvals.test_callbacks import broker, sandbox_server, workers  # noqa: E402
from tests.demo.sandbox_fixture import SandboxProcess  # noqa: E402
from tests.reconciliation.worker_fixture import Broker, Workers, wait_until  # noqa: E402

__all__ += ["broker", "sandbox_server", "workers"]


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a real worker shares PostgreSQL")
def test_a_real_worker_posts_the_request_then_replies_in_its_thread(
    runtime: Runtime,
    groups: Groups,
    slack_api: SlackApi,
    reviewer: Any,
    broker: Broker,
    workers: Workers,
    sandbox_server: SandboxProcess,
) -> None:
    # Slack refuses the first post (rate limited): the worker retries it with backoff, and
    # the decision, made meanwhile, waits for its thread.
    slack_api.answers = [(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "1"})]
    workers.start(
        sandbox_server,
        concurrency=2,
        CALLBACK_ALLOW_HTTP=1,
        CALLBACK_ALLOW_PRIVATE_HOSTS=1,
        NOTIFY_RETRY_BACKOFF_SECONDS=0.5,
        SLACK_API_URL=slack_api.url,
        CONSOLE_BASE_URL="https://console.example",
    )
    occurrence_id = propose(runtime, 90000, "worker")
    wait_until("the first post to be refused", lambda: NotificationAttempt.objects.exists())
    reject(occurrence_id, reviewer)

    wait_until(
        "both Slack app messages to be delivered",
        lambda: (
            NotificationDelivery.objects.filter(channel="slack_app", state="delivered").count() == 2
        ),
        timeout=60,
    )
    request, outcome = slack_api.posts
    parent = NotificationDelivery.objects.get(channel="slack_app", event__kind="requested")
    assert "thread_ts" not in request and "Review requested" in request["text"]
    assert parent.slack_ts and outcome["thread_ts"] == parent.slack_ts
    assert outcome["channel"] == CHANNEL and "Decided: rejected" in outcome["text"]
    codes = NotificationAttempt.objects.filter(delivery=parent).values_list(
        "status_code", flat=True
    )
    assert sorted(c or 0 for c in codes) == [200, 429]
    assert slack_api.refused == []
