"""The console served as in production, as real processes on the loopback: gunicorn from
``config/gunicorn.conf.py`` and ``bin/serve``, against the pytest-django test database.

Like the worker tests (``tests/reconciliation/worker_fixture.py``), a test that starts them
must be ``@pytest.mark.django_db(transaction=True)``: the servers see committed rows only,
and they must be stopped (and their connections gone) before pytest-django flushes or drops
the test database.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.reconciliation.worker_fixture import ROOT, children_of, worker_database_url

# The venv running the tests (.venv, or .venv-py3.13 under PYTHON=python3.13): its own gunicorn.
GUNICORN = Path(sys.executable).with_name("gunicorn")
METRICS_TOKEN = "metrics-" + os.urandom(12).hex()
START_TIMEOUT = 60.0
STOP_TIMEOUT = 40.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def collect_static(static_root: Path) -> None:
    """``manage.py collectstatic`` into ``static_root``, as a deployment does once."""
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT,
        env={**os.environ, "STATIC_ROOT": str(static_root)},
        check=True,
        timeout=120,
    )


# What this run's environment may hold that a deployment would not (the browser tests set
# DJANGO_ALLOW_ASYNC_UNSAFE in this process, which `check --deploy` rightly refuses).
NOT_INHERITED = (
    "DEBUG",
    "DJANGO_ALLOW_ASYNC_UNSAFE",
    "PROMETHEUS_MULTIPROC_DIR",
    "WEB_CONCURRENCY",
    "CONN_MAX_AGE",
)


def inherited_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in NOT_INHERITED:
        env.pop(name, None)
    return env


def production_env(*, broker_url: str, static_root: Path, **extra: Any) -> dict[str, str]:
    """DEBUG off, the test database, a real broker, on plain HTTP on the loopback."""
    env = inherited_env()
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": worker_database_url(),
            "CELERY_BROKER_URL": broker_url,
            "STATIC_ROOT": str(static_root),
            "METRICS_TOKEN": METRICS_TOKEN,
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            # Plain HTTP on the loopback: no Secure cookies, no redirect.
            "SESSION_COOKIE_SECURE": "0",
            "CSRF_COOKIE_SECURE": "0",
            "SECURE_SSL_REDIRECT": "0",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            "HOST": "127.0.0.1",
        }
    )
    env.update({key: str(value) for key, value in extra.items()})
    return env


class ServerProcess:
    """A server process (gunicorn, or bin/serve and what it starts), its own process group,
    its output in a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = log
        self.port = int(env["PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    def start(self, ready_path: str = "/healthz") -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            with suppress(httpx.HTTPError):
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        output = self.output()
        self.stop()
        raise RuntimeError(f"{self.name} did not become ready:\n{output[-5000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def descendants(self) -> list[int]:
        """Every live process below this one (gunicorn's workers, Celery's pool...)."""
        if self.proc is None:
            return []
        found, queue = [], [self.proc.pid]
        while queue:
            for child in children_of(queue.pop()):
                found.append(child)
                queue.append(child)
        return found

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """``sig`` (a graceful stop), then SIGKILL to the whole group after STOP_TIMEOUT."""
        proc, self.proc = self.proc, None
        if proc is None:
            return self.returncode
        if proc.poll() is None:
            proc.send_signal(sig)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        self.returncode = proc.wait()
        return self.returncode


def gunicorn(name: str, env: dict[str, str], workdir: Path) -> ServerProcess:
    """``gunicorn -c config/gunicorn.conf.py`` as bin/serve runs it (not yet started)."""
    metrics_dir = workdir / f"{name}-metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    env = {**env, "PORT": str(free_port()), "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    argv = [str(GUNICORN), "-c", "config/gunicorn.conf.py"]
    return ServerProcess(name, argv, env, workdir / f"{name}.log")


def scrape(
    url: str, token: str = METRICS_TOKEN
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code == 200, response.text
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for_sample(
    url: str, name: str, until: Callable[[float], bool], timeout: float, **labels: str
) -> None:
    """Scrape ``url`` until the sample ``name`` satisfies ``until``; fail after ``timeout``.

    A scrape that times out is tried again: while hundreds of clients connect at once, the
    server may answer its metrics late, and what the caller waits for is the sample, by
    its own deadline."""
    deadline = time.monotonic() + timeout
    value: float | str = "not scraped yet"
    while True:
        try:
            value = sample(scrape(url), name, **labels)
        except httpx.TimeoutException as exc:
            value = f"unknown (the scrape timed out: {exc})"
        else:
            if until(value):
                return
        if time.monotonic() > deadline:
            pytest.fail(f"{name} is {value} after {timeout} s")
        time.sleep(0.1)


ASGI_APPLICATION_NAME = "console-asgi-under-test"


@pytest.fixture
def asgi_server(tmp_path: Path, transactional_db: Any) -> Iterator[ServerProcess]:
    """gunicorn's asgi worker serving config/asgi.py (bin/serve's default), two workers,
    on the test database; its own rate limit out of the way of tests that wait in crowds."""
    env = production_env(
        broker_url="memory://",
        static_root=tmp_path / "static",
        GUNICORN_WORKER_CLASS="asgi",
        WEB_CONCURRENCY=2,
        API_RATE_LIMIT=1_000_000,
        # libpq names the pools' connections so that a test can count them apart.
        PGAPPNAME=ASGI_APPLICATION_NAME,
    )
    server = gunicorn("asgi", env, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
