"""Issue 26's deadlines end to end, with nothing called in-process: a real ``celery beat``
sends the deadlines sweep and a real worker runs it, escalates the request (its routing
rule's fallback group is told on its generic webhook, a real HTTP receiver checked with
``standardwebhooks``, and by e-mail, a real SMTP server) and then times it out. Meanwhile a
reviewer watching the review page in Chromium sees it turn escalated and then timed out
with no approve button, without reloading; the agent's long-poll (re-polling with the last
ETag on each change, as a client does) ends with ``timed_out``; and the approval the
reviewer's stale form would send is refused."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import connection
from playwright.sync_api import Page, expect
from standardwebhooks import Webhook

from approvals.audit.record import db_now
from approvals.models import AuditEvent, Occurrence, Tenant, ToolContract
from approvals.routing.changes import reviewer_group_save, routing_rule_save
from tests.approvals import smtp_fixture
from tests.approvals.smtp_fixture import Mailbox, parts
from tests.approvals.test_callbacks import Receiver, receiver
from tests.approvals.test_notifications import refund
from tests.browser.conftest import (
    Contexts,
    login,
    open_review,
    panel,
    track_navigations,
    wait_for_state,
)
from tests.conftest import Runtime
from tests.demo import sandbox_fixture
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation import worker_fixture
from tests.reconciliation.worker_fixture import Workers, wait_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="real workers share PostgreSQL with the test"
    ),
]

broker = worker_fixture.broker
workers = worker_fixture.workers
sandbox_server = sandbox_fixture.sandbox_server
smtp = smtp_fixture.smtp
__all__ = ["receiver"]  # the callbacks' HTTP receiver, here the fallback group's webhook

# Seconds after the proposal, on the database's clock. The review deadline leaves the page
# time to open before it passes; the gap to the final one leaves the panel's poll (every
# 2 s) many chances to show the escalation first, on a loaded machine too.
REVIEW_DEADLINE = timedelta(seconds=8)
FINAL_DEADLINE = timedelta(seconds=30)
# Generous: beat, worker and the panel's poll all run on a shared, busy machine.
SHOWN_WITHIN_MS = 90_000


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True


@dataclass
class LongPoll:
    """An agent waiting for its request's decision in a thread of its own: a plain read,
    then ``?wait=`` with the last ETag in ``If-None-Match``, again after every change, until
    the request is no longer pending. Keeps every state it was answered."""

    url: str
    key: str
    seen: list[tuple[str, bool]] = field(default_factory=list)
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="agent-long-poll", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            headers = {"Authorization": f"Bearer {self.key}"}
            with httpx.Client(headers=headers, timeout=60) as http:
                etag = ""
                deadline = time.monotonic() + 240
                while not self.stop.is_set() and time.monotonic() < deadline:
                    answer = http.get(
                        self.url,
                        params={"wait": 20} if etag else None,
                        headers={"If-None-Match": etag} if etag else None,
                    )
                    if answer.status_code == 304:
                        continue  # the wait ended with nothing new: ask again
                    answer.raise_for_status()
                    etag = answer.headers["ETag"]
                    body = answer.json()
                    self.seen.append((body["status"], body["escalated_at"] is not None))
                    if body["status"] != "pending_review":
                        return
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc

    def join(self, timeout: float) -> None:
        assert self.thread is not None
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.stop.set()
            self.thread.join(30)
            pytest.fail(f"the agent's long-poll did not end; it saw {self.seen}")
        if self.error is not None:
            raise self.error


def test_a_real_beat_escalates_to_the_fallback_group_then_times_out_live(
    contexts: Contexts,
    live_server: Any,
    tenant: Tenant,
    runtime: Runtime,
    admin_user: Any,
    reviewer: Any,
    second_reviewer: Any,
    smtp: Mailbox,
    receiver: Receiver,
    workers: Workers,
    sandbox_server: SandboxProcess,
) -> None:
    # Refunds are routed to support (Rita); finance-leads (Ravi, and a webhook) is the
    # rule's fallback group, told only when a request is escalated.
    for user, address in ((reviewer, "rita@acme.test"), (second_reviewer, "ravi@acme.test")):
        user.email = address
        user.save(update_fields=["email"])
    support = reviewer_group_save(
        tenant=tenant, admin=admin_user, name="support", member_ids=[reviewer.pk]
    ).group
    leads = reviewer_group_save(
        tenant=tenant,
        admin=admin_user,
        name="finance-leads",
        member_ids=[second_reviewer.pk],
        webhook_url=receiver.url,
    )
    routing_rule_save(
        tenant=tenant,
        admin=admin_user,
        tool="issue_refund",
        name="refunds",
        group_ids=[support.pk],
        fallback_group_id=leads.group.pk,
    )
    ToolContract.objects.filter(name="issue_refund").update(
        review_deadline=REVIEW_DEADLINE, final_deadline=FINAL_DEADLINE
    )

    env: dict[str, Any] = {
        "CALLBACK_ALLOW_HTTP": 1,
        "CALLBACK_ALLOW_PRIVATE_HOSTS": 1,
        "EMAIL_HOST": smtp.host,
        "EMAIL_PORT": smtp.port,
        "REVIEW_DEADLINES_SWEEP_SECONDS": 0.5,
    }
    worker = workers.start(sandbox_server, **env)
    beat = workers.start_beat(sandbox_server, **env)

    page: Page = contexts.new().new_page()
    login(page, reviewer.username)

    proposed = runtime.propose(arguments=refund(4200), client_ref="live-deadline")
    assert proposed.status_code == 201, proposed.content
    occurrence_id = proposed.json()["occurrence_id"]
    agent = LongPoll(
        url=f"{live_server.url}/api/v1/occurrences/{occurrence_id}", key=runtime.raw_key
    )
    agent.start()

    # Support is asked first; finance-leads hears nothing yet.
    (asked,) = smtp.wait_for(1)
    assert asked["To"] == "rita@acme.test"
    assert f"/reviews/{occurrence_id}/" in parts(asked)[0]

    open_review(page, occurrence_id)
    navigations = track_navigations(page)
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    assert occurrence.review_deadline_at is not None
    if db_now() < occurrence.review_deadline_at:
        # Opened in time (the usual case) the page shows it undecided and not escalated:
        # what follows is the page turning by itself.
        assert occurrence.escalated_at is None
    expect(page.locator("#approve-button")).to_be_visible()
    csrf = page.locator("#approve-form input[name=csrfmiddlewaretoken]").input_value()
    digest = page.locator("#approve-form input[name=action_digest]").input_value()
    assert receiver.received == []

    # The beat's sweep escalates it: the page says so, the fallback group is told.
    expect(panel(page).locator("#escalated")).to_contain_text("Escalated", timeout=SHOWN_WITHIN_MS)
    expect(page.locator("#approve-button")).to_be_visible()
    wait_until("the fallback group's webhook", lambda: bool(receiver.received), timeout=90)
    headers, body = receiver.received[0]
    told = Webhook(leads.secret).verify(body, headers)
    assert told["type"] == "review.escalated"
    assert told["group"] == "finance-leads"
    assert told["data"]["occurrence_id"] == occurrence_id
    mails = smtp.wait_for(2, timeout=90)
    escalated_mail = next(m for m in mails if m["To"] == "ravi@acme.test")
    assert "Escalated" in str(escalated_mail["Subject"])
    assert f"/reviews/{occurrence_id}/" in parts(escalated_mail)[0]

    # Then its final deadline passes: timed out, on the page, with nothing left to press.
    wait_for_state(page, "timed_out", timeout=SHOWN_WITHIN_MS)
    expect(panel(page).locator("#timed-out")).to_contain_text("Timed out")
    expect(page.locator("#occurrence-status")).to_have_text("Timed out")
    expect(page.locator("#approve-button")).to_have_count(0)
    expect(page.locator("#reject-button")).to_have_count(0)
    assert navigations.urls == [], "the page turned by its own poll, not by a reload"

    # The agent's long-poll saw it pending, escalated, and then timed out (never rejected).
    agent.join(timeout=120)
    changes = [s for n, s in enumerate(agent.seen) if n == 0 or s != agent.seen[n - 1]]
    assert changes[-1] == ("timed_out", True), agent.seen
    assert ("pending_review", True) in changes, agent.seen
    assert all(status in ("pending_review", "timed_out") for status, _ in changes)

    # The form the reviewer saw, sent after the timeout, approves nothing.
    refused = page.request.post(
        f"/reviews/{occurrence_id}/approve",
        form={"csrfmiddlewaretoken": csrf, "action_digest": digest},
        headers={"HX-Request": "true"},
    )
    assert refused.status == 200, refused.text()
    assert "timed out" in refused.text() and 'id="approve-button"' not in refused.text()
    assert Occurrence.objects.get(pk=occurrence_id).status == Occurrence.Status.TIMED_OUT
    kinds = list(
        AuditEvent.objects.filter(occurrence_id=occurrence_id)
        .order_by("id")
        .values_list("kind", "actor")
    )
    assert kinds == [
        ("occurrence.proposed", "runtime:agent"),
        ("occurrence.escalated", "console"),
        ("occurrence.timed_out", "console"),
    ]
    # Only the escalation reached the fallback group's webhook (the timeout is told to the
    # routed group, support, which has no webhook).
    assert [json.loads(b)["type"] for _, b in receiver.received] == ["review.escalated"]
    assert "Sending due task review-deadlines" in beat.output()
    assert "unregistered task" not in worker.output().lower()
