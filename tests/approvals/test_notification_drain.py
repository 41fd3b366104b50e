"""Issue 26's drain, debounced: a commit publishes ``approvals.notifications.drain`` only when
no drain is pending (a marker set with ``cache.add``), and the drain deletes the marker
before it reads the outbox, so an event committed before a publisher's add is always some
drain's: the marker protocol (with the race against the drainer's delete), the sweep as the
backstop of a lost drain, and a real worker on a real Redis draining many requests with a
few messages, every e-mail exactly once."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import caches
from django.db import connection
from django.utils import timezone

from approvals import broker as approvals_broker
from approvals.models import Channel, NotificationDelivery, NotificationEvent
from approvals.notifications import drain, tasks
from approvals.notifications.tasks import (
    drain_enqueue,
    notification_fan_out,
    notifications_drain,
    notifications_sweep,
)
from tests.approvals import smtp_fixture
from tests.approvals.smtp_fixture import Mailbox, parts
from tests.approvals.test_callbacks import receiver, sandbox_server
from tests.approvals.test_notifications import Setup, loopback_allowed, propose, routed
from tests.conftest import Runtime
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation import worker_fixture
from tests.reconciliation.worker_fixture import Broker, Workers, wait_until

smtp = smtp_fixture.smtp
broker = worker_fixture.broker
workers = worker_fixture.workers
__all__ = ["broker", "loopback_allowed", "receiver", "routed", "sandbox_server", "workers"]

DRAIN = "approvals.notifications.drain"


@pytest.fixture
def marker_cache(settings: Any) -> Any:
    """The marker's cache shared by publisher and drainer: here one process, so a local
    memory cache of the test's own (the console uses Redis)."""
    settings.CACHES = {
        **settings.CACHES,
        settings.NOTIFY_DRAIN_CACHE: {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "notify-drain-test",
        },
    }
    cache = caches[settings.NOTIFY_DRAIN_CACHE]
    cache.clear()
    return cache


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tasks published, instead of the broker."""
    sent: list[str] = []
    monkeypatch.setattr(
        approvals_broker, "publish", lambda task, args, countdown=None: sent.append(task.name)
    )
    return sent


def test_a_second_commit_while_a_drain_is_pending_publishes_nothing_and_the_drain_takes_both(
    runtime: Runtime, routed: Setup, smtp: Mailbox, marker_cache: Any, published: list[str]
) -> None:
    propose(runtime, 1000, "one")  # rita's e-mail each
    assert drain_enqueue()  # what the first request's commit does
    propose(runtime, 1000, "two")
    assert drain_enqueue()
    assert published == [DRAIN]  # the second found the first's drain pending

    assert notifications_drain() == 2

    assert len(smtp.messages) == 2
    assert not NotificationEvent.objects.filter(fanned_out_at__isnull=True).exists()
    drain_enqueue()  # the drain deleted the marker: the next commit publishes again
    assert published == [DRAIN, DRAIN]


def test_a_publisher_racing_the_drainers_delete_loses_no_event(
    runtime: Runtime,
    routed: Setup,
    smtp: Mailbox,
    marker_cache: Any,
    published: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    propose(runtime, 1000, "first")
    drain_enqueue()
    # Commit, then add, right before the drain starts: the add fails (the marker is there),
    # the event is left to the pending drain.
    propose(runtime, 1000, "before-the-delete")
    drain_enqueue()
    assert published == [DRAIN]

    scans: list[bool] = []
    real_scan = tasks.events_to_drain

    def scan(limit: int, skip: Any = ()) -> list[str]:
        # The marker is gone before the drain reads anything ...
        scans.append(marker_cache.get(drain.MARKER) is None)
        if len(scans) == 1:
            # ... so a commit landing between the delete and the read publishes a drain
            # of its own, and is read by this one too.
            propose(runtime, 1000, "between-delete-and-scan")
            drain_enqueue()
        return real_scan(limit, skip)

    monkeypatch.setattr(tasks, "events_to_drain", scan)
    assert notifications_drain() == 3
    assert scans[0] is True
    assert published == [DRAIN, DRAIN]
    assert len(smtp.messages) == 3
    assert not NotificationEvent.objects.filter(fanned_out_at__isnull=True).exists()

    # The second drain (a redelivered one alike) finds nothing left and sends nothing.
    monkeypatch.setattr(tasks, "events_to_drain", real_scan)
    assert notifications_drain() == 0
    assert len(smtp.messages) == 3


def test_a_drain_bounded_by_its_batches_publishes_the_next(
    runtime: Runtime,
    routed: Setup,
    smtp: Mailbox,
    marker_cache: Any,
    published: list[str],
    settings: Any,
) -> None:
    settings.NOTIFY_DRAIN_BATCH = 2
    settings.NOTIFY_DRAIN_MAX_BATCHES = 1
    for ref in ("a", "b", "c"):
        propose(runtime, 1000, ref)

    assert notifications_drain() == 2
    assert published == [DRAIN]  # one event is left: the next drain is published
    assert notifications_drain() == 1
    assert len(smtp.messages) == 3


def test_a_failing_event_does_not_hold_up_the_others_nor_loop(
    runtime: Runtime,
    routed: Setup,
    smtp: Mailbox,
    marker_cache: Any,
    published: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    poison = str(NotificationEvent.objects.get(occurrence_id=propose(runtime, 1000, "bad")).pk)
    propose(runtime, 1000, "good")
    real = tasks.event_dispatch

    def dispatch(event_id: str) -> Any:
        if event_id == poison:
            raise RuntimeError("a fan-out that fails")
        return real(event_id)

    monkeypatch.setattr(tasks, "event_dispatch", dispatch)
    assert notifications_drain() == 1  # tried once, left to the sweep
    assert len(smtp.messages) == 1
    assert NotificationEvent.objects.filter(fanned_out_at__isnull=True).count() == 1


def test_the_sweep_fans_out_an_event_whose_drain_was_lost(
    runtime: Runtime,
    routed: Setup,
    smtp: Mailbox,
    marker_cache: Any,
    published: list[str],
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    # Lost in the broker: published, never run. The marker keeps later commits from
    # publishing until its TTL; the sweep fans out whatever waits past its grace.
    propose(runtime, 1000, "lost")
    drain_enqueue()
    propose(runtime, 1000, "behind-the-lost-one")
    drain_enqueue()
    assert published == [DRAIN]
    assert notifications_sweep() == 0  # within the grace: the drain's
    NotificationEvent.objects.update(
        created_at=timezone.now() - timedelta(seconds=settings.NOTIFY_SWEEP_GRACE_SECONDS + 1)
    )
    notifications_sweep()
    notifications_sweep()  # its deliveries, each published by the sweep, are sent here
    assert not NotificationEvent.objects.filter(fanned_out_at__isnull=True).exists()
    emails = NotificationDelivery.objects.filter(channel=Channel.EMAIL)
    assert emails.count() == 2

    # Not published at all (the broker was down): the marker is deleted at once, so the
    # next commit publishes.
    def down(task: Any, args: Any, countdown: Any = None) -> None:
        raise ConnectionError("broker down")

    marker_cache.clear()
    monkeypatch.setattr(approvals_broker, "publish", down)
    assert drain_enqueue() is False
    assert marker_cache.get(drain.MARKER) is None


def test_a_fan_out_message_queued_before_the_upgrade_is_still_served(
    runtime: Runtime, routed: Setup, smtp: Mailbox, published: list[str]
) -> None:
    event = str(NotificationEvent.objects.get(occurrence_id=propose(runtime, 1000, "old")).pk)
    assert notification_fan_out(event) == 1
    assert notification_fan_out(event) == 0
    assert len(smtp.messages) == 1


def test_without_a_shared_cache_every_commit_publishes_a_drain(
    runtime: Runtime, routed: Setup, published: list[str], settings: Any
) -> None:
    # The demo's filesystem broker has no Redis: the marker's cache is the dummy one.
    settings.CACHES = {
        **settings.CACHES,
        settings.NOTIFY_DRAIN_CACHE: {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
    }
    drain_enqueue()
    drain_enqueue()
    assert published == [DRAIN, DRAIN]


# --- a real worker, a real Redis -------------------------------------------------------------


@pytest.mark.race
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a real worker shares PostgreSQL")
def test_a_real_worker_drains_many_requests_with_few_messages_each_e_mail_once(
    runtime: Runtime,
    routed: Setup,
    smtp: Mailbox,
    broker: Broker,
    workers: Workers,
    sandbox_server: SandboxProcess,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # This process's marker is the worker's: the same Redis, the same key.
    settings.CACHES = {
        **settings.CACHES,
        settings.NOTIFY_DRAIN_CACHE: {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": broker.url,
            "KEY_PREFIX": f"console:notify:{settings.CALLBACKS_QUEUE}",
        },
    }
    names: list[str] = []
    real_publish = approvals_broker.publish

    def counted(task: Any, args: Any, countdown: Any = None) -> None:
        names.append(task.name)
        real_publish(task, args, countdown=countdown)

    monkeypatch.setattr(approvals_broker, "publish", counted)

    # Twenty requests committed before any worker runs: one drain message for them all.
    first = [propose(runtime, 1000, f"burst-{i}") for i in range(20)]
    assert names == [DRAIN]
    worker = workers.start(
        sandbox_server,
        concurrency=2,
        queues=(worker_fixture.CALLBACKS_QUEUE,),
        EMAIL_HOST=smtp.host,
        EMAIL_PORT=smtp.port,
        CONSOLE_BASE_URL="https://console.example",
    )
    smtp.wait_for(20)

    # Ten more while it runs: each commit publishes only when no drain is pending.
    later = [propose(runtime, 1000, f"running-{i}") for i in range(10)]
    smtp.wait_for(30)
    wait_until(
        "every event fanned out",
        lambda: not NotificationEvent.objects.filter(fanned_out_at__isnull=True).exists(),
        timeout=60,
    )
    assert 1 < names.count(DRAIN) <= 11, names
    received = len(re.findall(rf"Task {DRAIN}\[\S+\] received", worker.output()))
    assert received >= names.count(DRAIN) - 1  # the last may still be queued

    # Every e-mail exactly once: one per request, each its own review link.
    links = sorted(
        next(line for line in parts(m)[0].splitlines() if "/reviews/" in line)
        for m in smtp.messages
    )
    assert len(smtp.messages) == 30 and len(set(links)) == 30
    for occurrence_id in first + later:
        assert any(occurrence_id in link for link in links)
    sent = NotificationDelivery.objects.filter(channel=Channel.EMAIL)
    assert sorted(set(sent.values_list("state", "attempts"))) == [("delivered", 1)]
    assert sent.count() == 30
