"""How fast does the notification outbox drain, against a bare Celery task?

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/console_bench \\
    REDIS_URL=redis://127.0.0.1:6379/12 \\
        .venv/bin/python bench/notify_bench.py [--requests 1000] [--members 1] [--concurrency 2]
    .venv/bin/python bench/notify_bench.py --tiny       # 20 requests: what tests/bench runs
    .venv/bin/python bench/notify_bench.py --profile    # and where a drained request's time goes
    .venv/bin/python bench/notify_bench.py --drain-log  # and what each drain task did

``--requests`` pending refunds are proposed through the service
(``approvals.reviews.proposals.occurrence_propose``) in a tenant whose routing rule sends
``issue_refund`` to a group of ``--members`` reviewers, each with an e-mail address; the
e-mail goes over SMTP to a real server in this process (aiosmtpd), as in
``tests/approvals/test_notifications.py``. The requests' fan-out is not published at their
commit: a real Celery worker (``celery -A config worker -Q callbacks``, prefork, as
``bin/serve`` starts the callbacks worker) is started first and left idle, then the arms
are timed, each from its first publish to the last row the worker settled (the database's
time of that row):

- **bare** (the baseline): as many pending outbox rows as the drain sends, each marked sent
  by a bare task (``bench.notify_bench_tasks.mark_sent``: one ``UPDATE``), one message per
  row; measured before and after the drain, and their mean is the baseline;
- **drain**: the outbox's own work. For each request, what its commit calls
  (``approvals.notifications.tasks.fan_out_enqueue``): a debounced
  ``approvals.notifications.drain``, published only when no drain is pending (a marker
  set with ``cache.add`` in the broker's Redis, ``approvals.notifications.drain``), so
  that a few drain messages carry many requests. A drain fans out the events a batch at a
  time and, for a small audience (at most ``NOTIFY_INLINE_DELIVERIES`` due, 5 by
  default), sends them itself: each row written leased, each e-mail sent on the process's
  SMTP connection and its attempt recorded (``approvals.outbound.outbox.attempt_leased``);
  a larger audience publishes one ``approvals.notifications.deliver`` each. The drain
  messages published and the drain tasks the worker ran are printed.

It prints events fanned out and e-mails sent per second, the ratio drain/bare (deliveries
sent per second over rows marked per second; the issue's target is >= 0.5), and the
queries of creating one request with its routing rule and notification against the same
creation with both taken out (as ``tests/approvals/test_routing.py`` pins: one more). It
exits 1 if the server did not receive every e-mail or any row was left unsent.

The database DATABASE_URL names is created if missing and migrated; each run adds a tenant
(``notify-<hex>``) and leaves its rows, so give it a database of its own. The broker is
``CELERY_BROKER_URL`` or ``REDIS_URL``: give it a Redis database of its own, since the
bench empties the ``callbacks`` queue there before it starts.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


BROKER_URL = os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or ""
# The worker and this process publish to the same broker (checked in main, after --help);
# e-mail goes over SMTP.
if BROKER_URL:
    os.environ["CELERY_BROKER_URL"] = BROKER_URL
os.environ["EMAIL_BACKEND"] = "django.core.mail.backends.smtp.EmailBackend"
os.environ.setdefault("LOG_LEVEL", "WARNING")

from bench.django_setup import setup_django

setup_django(debug_off=True)

import redis
from aiosmtpd.controller import Controller
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Max
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import broker
from approvals.models import (
    Channel,
    Membership,
    NotificationDelivery,
    NotificationEvent,
    RuntimeKey,
    Tenant,
)
from approvals.notifications import outbox as notification_outbox
from approvals.notifications import tasks as notification_tasks
from approvals.notifications.delivery import event_dispatch
from approvals.notifications.drain import drain_started
from approvals.reviews import proposals
from approvals.reviews.proposals import occurrence_propose
from approvals.routing.changes import reviewer_group_save, routing_rule_save
from bench.claim_bench import make_world, prepare_database
from bench.notify_bench_tasks import mark_sent

QUEUE = settings.CALLBACKS_QUEUE
START_TIMEOUT = 90.0
Delivered = NotificationDelivery.State.DELIVERED


class Inbox:
    """The SMTP server's handler (aiosmtpd): it only counts what it receives."""

    def __init__(self) -> None:
        self.received = 0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.received += 1
        return "250 OK"


@contextlib.contextmanager
def smtp_server() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    with socket.socket() as probe:  # aiosmtpd checks its start by connecting: a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


class Worker:
    """``celery -A config worker -Q callbacks`` in its own process group, output in a file."""

    def __init__(self, workdir: Path, concurrency: int, env: dict[str, str]) -> None:
        self.log = workdir / "worker.log"
        celery = str(Path(sys.executable).with_name("celery"))
        argv = [
            *(celery, "-A", "config", "worker", "--pool", "prefork", "-Q", QUEUE),
            *("--concurrency", str(concurrency), "--loglevel", "INFO"),
            *("--include", "bench.notify_bench_tasks", "-n", f"notify-bench-{os.getpid()}@%h"),
            *("--without-heartbeat", "--without-gossip", "--without-mingle"),
        ]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while " ready." not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"notify_bench: the worker did not start:\n{self.output()}")
            time.sleep(0.1)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Scene:
    """The tenant: its key, a group of reviewers with e-mail, the rule routing refunds there."""

    def __init__(self, members: int) -> None:
        world = make_world()
        self.tenant: Tenant = world.tenant
        self.key: RuntimeKey = world.key
        users = get_user_model().objects
        admin = users.create_user(username=f"{self.tenant.slug}-admin")
        Membership.objects.create(user=admin, tenant=self.tenant, role=Membership.Role.ADMIN)
        self.members = members
        self.member_ids = []
        for i in range(members):
            user = users.create_user(
                username=f"{self.tenant.slug}-r{i}", email=f"r{i}@{self.tenant.slug}.test"
            )
            Membership.objects.create(user=user, tenant=self.tenant, role=Membership.Role.REVIEWER)
            self.member_ids.append(user.pk)
        group = reviewer_group_save(
            tenant=self.tenant, admin=admin, name="refund-reviewers", member_ids=self.member_ids
        ).group
        routing_rule_save(
            tenant=self.tenant,
            admin=admin,
            tool="issue_refund",
            name="refunds",
            group_ids=[group.pk],
        )
        self.proposed = 0

    def propose(self) -> None:
        self.proposed += 1
        occurrence_propose(
            runtime_key=self.key,
            tool="issue_refund",
            arguments={
                "payment_id": f"pay_{self.proposed}",
                "amount_minor": 8000,
                "currency": "EUR",
                "reason": "Benchmark",
            },
            run_id="notify-bench",
            reason="notify bench",
            client_ref=f"notify-{self.proposed}",
        )


@contextlib.contextmanager
def unpublished() -> Iterator[None]:
    """The events are written, their fan-out not published at commit (the arm does it)."""
    original = notification_outbox.fan_out_enqueue
    notification_outbox.fan_out_enqueue = lambda event_id: True  # type: ignore[assignment]
    try:
        yield
    finally:
        notification_outbox.fan_out_enqueue = original


def wait_for(what: str, condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"notify_bench: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def bare_arm(scene: Scene, rows: int, timeout: float) -> float:
    """Rows marked sent per second by the bare task, one message per row."""
    now = timezone.now()
    made = NotificationDelivery.objects.bulk_create(
        NotificationDelivery(
            tenant=scene.tenant,
            channel=Channel.EMAIL,
            user_id=scene.member_ids[i % len(scene.member_ids)],
            body={"bench": "bare"},
            # Far in the future: no sweep would ever send these for real.
            next_attempt_at=now + timedelta(days=365),
        )
        for i in range(rows)
    )
    ids = [str(row.pk) for row in made]
    mine = NotificationDelivery.objects.filter(pk__in=ids)
    start = timezone.now()
    for pk in ids:
        broker.publish(mark_sent, (pk,))
    wait_for("the bare task", lambda: mine.filter(state=Delivered).count() == rows, timeout)
    last = mine.aggregate(last=Max("delivered_at"))["last"]
    return rows / (last - start).total_seconds()


@contextlib.contextmanager
def counting_publishes() -> Iterator[list[str]]:
    """The names of the tasks this process publishes meanwhile."""
    names: list[str] = []
    original = broker.publish

    def counted(task: Any, args: tuple[Any, ...], *, countdown: float | None = None) -> None:
        names.append(task.name)
        original(task, args, countdown=countdown)

    broker.publish = counted  # type: ignore[assignment]
    try:
        yield names
    finally:
        broker.publish = original  # type: ignore[assignment]


def drain_arm(
    scene: Scene, inbox: Inbox, requests: int, timeout: float
) -> tuple[float, float, int]:
    """Events fanned out and e-mails sent per second, from the first publish of the
    commits' path (debounced), and the drain messages that path published."""
    before = set(NotificationEvent.objects.filter(tenant=scene.tenant).values_list("pk", flat=True))
    with unpublished():
        for _ in range(requests):
            scene.propose()
    events = [
        str(pk)
        for pk in NotificationEvent.objects.filter(tenant=scene.tenant).values_list("pk", flat=True)
        if pk not in before
    ]
    assert len(events) == requests, f"{len(events)} events for {requests} requests"
    mails = requests * len(scene.member_ids)
    sent = NotificationDelivery.objects.filter(
        event_id__in=events, channel=Channel.EMAIL, state=Delivered
    )
    received = inbox.received
    drain_started()  # a marker an earlier run left would hold the first publish back
    start = timezone.now()
    with counting_publishes() as names:
        for event_id in events:
            notification_tasks.fan_out_enqueue(event_id)  # what each commit calls
    wait_for("the outbox to drain", lambda: sent.count() == mails, timeout)
    last = sent.aggregate(last=Max("delivered_at"))["last"]
    seconds = (last - start).total_seconds()
    if inbox.received - received != mails:
        sys.exit(f"notify_bench: the server got {inbox.received - received} of {mails} e-mails")
    return requests / seconds, mails / seconds, names.count(notification_tasks.DRAIN_TASK)


def creation_queries(scene: Scene) -> tuple[list[str], list[str]]:
    """The queries of creating one request, routed and notified, then with both taken out
    (as tests/approvals/test_routing.py does)."""

    def captured() -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            scene.propose()
        return [q["sql"] for q in queries.captured_queries]

    with unpublished():
        captured()  # warm: the contract's first read
        routed = captured()
        saved = proposals.notification_event_create, proposals.routing_version
        proposals.notification_event_create = lambda **_: None  # type: ignore[assignment]
        proposals.routing_version = lambda **_: None  # type: ignore[assignment]
        try:
            bare = captured()
        finally:
            proposals.notification_event_create, proposals.routing_version = saved
    return routed, bare


def profile_drain(scene: Scene, requests: int) -> None:
    """The drain's work in this process, without Celery: what the fan-out task does for
    each event (``event_dispatch``: fan out, then send a small audience's deliveries
    itself); timed first without the profiler, then where the time goes, and the queries
    of each step. The first request is left out of both: it pays the URLconf's one-time
    load (the first ``reverse()``), as a worker process does once."""
    with unpublished():
        for _ in range(2 * requests + 1):
            scene.propose()
    events = [
        str(pk)
        for pk in NotificationEvent.objects.filter(tenant=scene.tenant, fanned_out_at__isnull=True)
        .order_by("created_at")
        .values_list("pk", flat=True)[: 2 * requests + 1]
    ]
    event_dispatch(events.pop(0))
    timed, profiled = events[:requests], events[requests:]
    start = time.perf_counter()
    for event_id in timed:
        event_dispatch(event_id)
    plain = (time.perf_counter() - start) / len(timed)
    profile = cProfile.Profile()
    queries_per_request = 0
    for event_id in profiled:
        with CaptureQueriesContext(connection) as queries:
            profile.enable()
            done = event_dispatch(event_id)
            profile.disable()
        assert not done.publish, "the profile expects a small audience, sent inline"
        queries_per_request += len(queries)
    print(
        f"\nprofile: {len(timed)} requests dispatched in this process without Celery (fan-out "
        f"and {scene.members} e-mail(s) each): {plain * 1e3:.1f} ms a request without the "
        f"profiler; {queries_per_request / len(profiled):.1f} statements a request "
        f"(BEGIN and COMMIT included)"
    )
    pstats.Stats(profile).sort_stats("cumulative").print_stats(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--members", type=int, default=1, help="reviewers in the routed group")
    parser.add_argument("--concurrency", type=int, default=2, help="the worker's processes")
    parser.add_argument("--tiny", action="store_true", help="20 requests (the smoke test)")
    parser.add_argument("--profile", action="store_true", help="profile the drain in-process")
    parser.add_argument("--drain-log", action="store_true", help="print each drain task's log line")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per arm, at most")
    args = parser.parse_args()
    # A SIGTERM (a test's timeout) still stops the worker: the ``finally`` below runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    requests = 20 if args.tiny else args.requests

    if not BROKER_URL.startswith(("redis://", "rediss://")):
        sys.exit("notify_bench: set REDIS_URL (or CELERY_BROKER_URL) to a Redis database.")
    server = prepare_database()
    queue = redis.Redis.from_url(BROKER_URL)
    queue.delete(QUEUE)  # what an earlier run left would be drained in this one's arms
    # A drain takes every event not fanned out, whichever tenant's: those an earlier run
    # left (its query count's) would be sent in this one's drain arm.
    NotificationEvent.objects.filter(fanned_out_at__isnull=True).update(
        fanned_out_at=timezone.now()
    )
    scene = Scene(args.members)
    mails = requests * args.members
    with smtp_server() as (inbox, port), tempfile.TemporaryDirectory() as workdir:
        level = "INFO" if args.drain_log else "WARNING"
        env = {"EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(port), "LOG_LEVEL": level}
        os.environ.update(env)
        worker = Worker(Path(workdir), args.concurrency, env)
        try:
            print(
                f"{server}; broker {settings.CELERY_BROKER_URL.rsplit('@', 1)[-1]}; worker "
                f"-Q {QUEUE} --concurrency {args.concurrency} (prefork) on {os.cpu_count()} "
                f"cores; load average {os.getloadavg()[0]:.1f}\n"
                f"{requests} requests routed to a group of {args.members}: {mails} e-mails "
                f"to aiosmtpd on 127.0.0.1:{port}\n"
            )
            bare_before = bare_arm(scene, mails, args.timeout)
            events_rate, mail_rate, drains = drain_arm(scene, inbox, requests, args.timeout)
            bare_after = bare_arm(scene, mails, args.timeout)
        finally:
            worker.stop()
        if args.drain_log:  # each drain task: deliveries sent, events tried
            print("\n".join(line for line in worker.output().splitlines() if "drained" in line))
        ran = len(
            re.findall(rf"Task {notification_tasks.DRAIN_TASK}\[\S+\] received", worker.output())
        )
        if args.profile:
            profile_drain(scene, min(requests, 100))
    baseline = (bare_before + bare_after) / 2
    ratio = mail_rate / baseline
    print(f"{'arm':<28} {'rows':>6} {'rate/s':>8}")
    print(f"{'bare task, before':<28} {mails:>6} {bare_before:>8.1f}")
    print(f"{'drain: events fanned out':<28} {requests:>6} {events_rate:>8.1f}")
    print(f"{'drain: e-mails sent':<28} {mails:>6} {mail_rate:>8.1f}")
    print(f"{'bare task, after':<28} {mails:>6} {bare_after:>8.1f}")
    print(
        f"drain messages: {drains} published by the {requests} commits, {ran} drain tasks "
        f"run by the worker (a drain that reached its last batch publishes the next)"
    )
    verdict = "reached" if ratio >= 0.5 else "below"
    print(
        f"\nratio drain/bare: {ratio:.3f}  (target >= 0.5: {verdict}; e-mails sent per "
        f"second / rows the bare task marked per second, mean of before and after)"
    )
    routed, bare = creation_queries(scene)
    extra = [q.split("(")[0].strip() for q in routed if "approvals_notificationevent" in q]
    print(
        f"queries to create a request: {len(routed)} routed and notified, {len(bare)} "
        f"without routing rule and notification ({len(routed) - len(bare):+d}: {extra})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
