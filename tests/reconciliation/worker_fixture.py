"""Real Celery worker (and beat) processes on a real Redis, for the tests that kill them.

``bin/test`` starts a throwaway Redis and exports ``REDIS_URL`` (or uses the one it is
given). The worker tests use the database number ``REDIS_URL`` names, or 1 when it names
none, and empty it before each test. Without ``REDIS_URL`` they fail, on purpose: a skipped
crash test proves nothing, so run them through ``bin/test``.

A worker is ``celery -A config worker`` exactly as deployed (prefork, prefetch 1, late
acknowledgement and ``reject_on_worker_lost`` from the settings), with its database pointed
at the pytest-django test database, so the test must be
``@pytest.mark.django_db(transaction=True)``: the worker sees only committed rows. While a
test runs, this process's Celery app publishes to the same Redis (a claim's on-commit
announcement then reaches the workers); it is put back afterwards.

Bind the fixtures in a test module by assignment (see ``sandbox_fixture``)::

    from tests.reconciliation import worker_fixture

    broker = worker_fixture.broker
    workers = worker_fixture.workers
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
import redis
from django.db import connection

from config.celery import app as celery_app
from tests.demo.sandbox_fixture import ROOT, SandboxProcess

# The venv running the tests (.venv, or .venv-py3.13 under PYTHON=python3.13): its own celery.
CELERY = Path(sys.executable).with_name("celery")
QUEUE = "celery"
CALLBACKS_QUEUE = "callbacks"
# kombu's Redis transport keeps a delivered, unacknowledged message in these keys.
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
DEFAULT_DB = 1
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
# Longer than any test here waits: a message that comes back within a test came back
# because the worker's master requeued it, never because this timeout expired.
LONG_VISIBILITY_TIMEOUT = 3600
# How the workers' and beat's connections show in pg_stat_activity (libpq's PGAPPNAME), so
# that teardown waits for theirs and not for one this process's threads keep (a live
# server's request thread keeps its connection for CONN_MAX_AGE).
CELERY_APPLICATION_NAME = "console-test-celery"


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 120.0) -> float:
    """Poll ``condition`` until it holds; the seconds it took. Fails after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - start


def broker_url() -> str:
    """REDIS_URL with the worker tests' database number."""
    url = os.environ.get("REDIS_URL", "")
    if not url:
        pytest.fail(
            "REDIS_URL is not set: these tests run real Celery workers on a real Redis. "
            "Run them with bin/test, which starts a throwaway Redis, or set REDIS_URL.",
            pytrace=False,
        )
    parts = urlsplit(url)
    db = parts.path.strip("/") or str(DEFAULT_DB)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def worker_database_url() -> str:
    """The pytest-django test database (not the one DATABASE_URL names) as a URL."""
    settings = connection.settings_dict
    assert connection.vendor == "postgresql", "the worker tests run on PostgreSQL"
    user = quote(settings["USER"] or "", safe="")
    password = quote(settings["PASSWORD"] or "", safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings["HOST"] or "127.0.0.1"
    port = f":{settings['PORT']}" if settings["PORT"] else ""
    return f"postgres://{credentials}{host}{port}/{quote(settings['NAME'], safe='')}"


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the prefork pool of a worker's master)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


class Broker:
    """The Redis database the workers consume from, and a client to look into it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url)

    def purge(self) -> None:
        """Empty the database: queued messages and unacknowledged ones alike."""
        self.client.flushdb()

    def queued(self) -> int:
        return int(self.client.llen(QUEUE))

    def unacked(self) -> int:
        return int(self.client.hlen(UNACKED))

    def unacked_ages(self) -> list[float]:
        """Seconds since each unacknowledged message was delivered."""
        now = time.time()
        entries = cast(
            "list[tuple[bytes, float]]",
            self.client.zrange(UNACKED_INDEX, 0, -1, withscores=True),
        )
        return [now - score for _, score in entries]

    def idle(self) -> bool:
        """Nothing queued and nothing delivered but unacknowledged."""
        return self.queued() == 0 and self.unacked() == 0

    @contextmanager
    def publishing_to(self, url: str) -> Iterator[None]:
        """Let this process's Celery app publish to ``url`` for a while (a broker that is
        down, say), then to this broker again."""
        celery_app.conf.update(broker_url=url)
        try:
            yield
        finally:
            celery_app.conf.update(broker_url=self.url)


class CeleryProcess:
    """One ``celery -A config worker`` (or ``beat``) process, its output in a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def start(self, ready: str) -> None:
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Its own process group: a stray signal to ours never reaches it, and
                # teardown can kill the whole group (master and pool) at once.
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if ready in self.output():
                return
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not start:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def children(self) -> list[int]:
        return children_of(self.pid) if self.running() else []

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill_child(self) -> int | None:
        """SIGKILL one pool process at random (as ``kill -9`` would); its pid, or None."""
        pool = self.children()
        if not pool:
            return None
        victim = random.choice(pool)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return victim

    def stop(self) -> int | None:
        """SIGTERM (a warm shutdown), then SIGKILL the whole process group."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        pool = children_of(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in pool:  # in case one left the group
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        return proc.returncode


class Workers:
    """Starts worker and beat processes for one test and stops them all after it."""

    def __init__(self, broker: Broker, workdir: Path) -> None:
        self.broker = broker
        self.workdir = workdir
        self.processes: list[CeleryProcess] = []

    def environment(self, sandbox: SandboxProcess, **extra: Any) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "config.settings",
                "DATABASE_URL": worker_database_url(),
                "CELERY_BROKER_URL": self.broker.url,
                "CELERY_VISIBILITY_TIMEOUT": str(LONG_VISIBILITY_TIMEOUT),
                "PAYMENTS_URL": sandbox.url,
                "PAYMENTS_API_KEY": sandbox.api_key,
                "MESSAGES_WEBHOOK_URL": f"{sandbox.url}/v1/messages",
                "MESSAGES_WEBHOOK_SECRET": sandbox.webhook_secret,
                "ADAPTER_READ_TIMEOUT": "1",
                "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
                "PYTHONUNBUFFERED": "1",
                "PGAPPNAME": CELERY_APPLICATION_NAME,
            }
        )
        env.pop("RECONCILIATION_CRASH_AT", None)
        env.pop("RECONCILIATION_CRASH_DIR", None)
        env.update({key: str(value) for key, value in extra.items()})
        return env

    def start(
        self,
        sandbox: SandboxProcess,
        *,
        concurrency: int = 1,
        queues: tuple[str, ...] = (QUEUE, CALLBACKS_QUEUE),
        **env: Any,
    ) -> CeleryProcess:
        """A worker of ``queues`` (commands and callbacks, as a deployment consumes both);
        ``env`` adds to (or overrides) its environment, e.g.
        ``RECONCILIATION_CRASH_AT="after_call"`` or ``CELERY_VISIBILITY_TIMEOUT=1``."""
        name = f"worker{len(self.processes) + 1}"
        argv = [
            str(CELERY),
            "-A",
            "config",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(concurrency),
            "--prefetch-multiplier",
            "1",
            "-Q",
            ",".join(queues),
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "info",
            "-n",
            f"{name}-{os.getpid()}@%h",
        ]
        process = CeleryProcess(
            name, argv, self.environment(sandbox, **env), self.workdir / f"{name}.log"
        )
        self.processes.append(process)
        process.start(ready=" ready.")
        return process

    def start_beat(self, sandbox: SandboxProcess, **env: Any) -> CeleryProcess:
        """``celery beat`` with the settings' schedule (the outbox sweep)."""
        name = f"beat{len(self.processes) + 1}"
        argv = [
            str(CELERY),
            "-A",
            "config",
            "beat",
            "--loglevel",
            "info",
            "--schedule",
            str(self.workdir / f"{name}-schedule"),
        ]
        process = CeleryProcess(
            name, argv, self.environment(sandbox, **env), self.workdir / f"{name}.log"
        )
        self.processes.append(process)
        process.start(ready="beat: Starting")
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


def other_connections(name: str, application_name: str | None) -> list[tuple[Any, ...]]:
    """Other client connections to database ``name`` (only ``application_name``'s, if given):
    pid, application name, state, wait event, backend start and the query's first words."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, coalesce(application_name, ''), state, wait_event, backend_start,"
            " left(query, 120) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            " AND (%s::text IS NULL OR application_name = %s::text)",
            [name, application_name, application_name],
        )
        return [tuple(row) for row in cursor.fetchall()]


def release_test_database(timeout: float = 15.0, application_name: str | None = None) -> None:
    """Wait until no other process holds a connection to the test database (pytest-django
    drops it at the end of the session), or none named ``application_name``; end any that
    outlive the deadline, and fail."""
    name = connection.settings_dict["NAME"]
    deadline = time.monotonic() + timeout
    while (left := other_connections(name, application_name)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        with connection.cursor() as cursor:
            for pid, *_ in left:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        pytest.fail(f"connections to the test database outlived their processes: {left}")


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    """An empty Redis database, which this process's Celery app publishes to meanwhile."""
    url = broker_url()
    # The environment variable would win over the app's configuration.
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    target = Broker(url)
    try:
        target.client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"cannot reach Redis at REDIS_URL ({exc}); run bin/test", pytrace=False)
    target.purge()
    previous = celery_app.conf.broker_url
    celery_app.conf.update(broker_url=url)
    try:
        yield target
    finally:
        celery_app.conf.update(broker_url=previous)
        target.purge()
        target.client.close()


@pytest.fixture
def workers(broker: Broker, transactional_db: Any, tmp_path: Path) -> Iterator[Workers]:
    """Start workers with ``workers.start(sandbox, **env)``; all are stopped after the test,
    before the test database is flushed, and none keeps a connection to it."""
    started = Workers(broker, tmp_path)
    try:
        yield started
    finally:
        started.stop()
        release_test_database(application_name=CELERY_APPLICATION_NAME)
