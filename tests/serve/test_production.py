"""``bin/serve`` as a deployment runs it: DEBUG off, PostgreSQL, Redis, gunicorn from
config/gunicorn.conf.py with a Celery worker and beat beside it. It renders the console
with its hashed, compressed stylesheet, answers the load balancer's probes, exports
metrics to the holder of the token only, and stops every process it started on SIGTERM.
Before that, it refuses what a deployment must not run with."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from django.db import connection

from tests.reconciliation import worker_fixture
from tests.reconciliation.worker_fixture import (
    Broker,
    children_of,
    release_test_database,
    wait_until,
)
from tests.serve.servers import (
    METRICS_TOKEN,
    ROOT,
    ServerProcess,
    free_port,
    inherited_env,
    production_env,
    sample,
    scrape,
)

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="bin/serve runs on PostgreSQL and Redis"
    ),
    pytest.mark.slow,  # bin/serve starts gunicorn, a worker and beat
]

broker = worker_fixture.broker
SERVE = str(ROOT / "bin" / "serve")


def running(pid: int) -> bool:
    """Alive, not a zombie waiting for whoever inherited it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def run_serve(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SERVE, "--no-install", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def serving(
    broker: Broker, transactional_db: Any, tmp_path: Path
) -> Iterator[tuple[ServerProcess, Path]]:
    """bin/serve on a free port, against the test database; stopped after the test."""
    static_root = tmp_path / "static"
    env = production_env(
        broker_url=broker.url,
        static_root=static_root,
        PORT=free_port(),
        SERVE_DIR=tmp_path / "serve",
        WEB_CONCURRENCY=2,
        CELERY_CONCURRENCY=1,
        STOP_TIMEOUT=30,
    )
    server = ServerProcess("bin/serve", [SERVE, "--no-install"], env, tmp_path / "serve.log")
    try:
        server.start(ready_path="/readyz")
        yield server, static_root
    finally:
        server.stop()
        release_test_database()


def test_bin_serve_serves_the_console_as_production(
    serving: tuple[ServerProcess, Path],
) -> None:
    server, static_root = serving
    with httpx.Client(base_url=server.url, timeout=10) as http:
        page = http.get("/accounts/login/")
        assert page.status_code == 200
        assert "Server" in page.headers and page.headers["Server"].startswith("gunicorn")
        # The stylesheet under its hashed name, served by the app itself, cached for ever.
        found = re.search(r'href="(/static/console/console\.([0-9a-f]{12})\.css)"', page.text)
        assert found, page.text[:2000]
        css_url = found.group(1)
        assert (static_root / css_url.removeprefix("/static/")).is_file()
        css = http.get(css_url, headers={"Accept-Encoding": "identity"})
        assert css.status_code == 200
        assert css.headers["Content-Type"].startswith("text/css")
        assert "immutable" in css.headers["Cache-Control"]
        assert css.content == (ROOT / "static" / "console" / "console.css").read_bytes()
        compressed = http.get(css_url, headers={"Accept-Encoding": "gzip"})
        assert compressed.headers.get("Content-Encoding") == "gzip"
        assert compressed.content == css.content  # decoded by httpx
        script = re.search(r'src="(/static/console/console\.[0-9a-f]{12}\.js)"', page.text)
        assert script and http.get(script.group(1)).status_code == 200

        healthz = http.get("/healthz")
        assert (healthz.status_code, healthz.json()) == (200, {"status": "ok"})
        readyz = http.get("/readyz")
        assert readyz.status_code == 200
        assert readyz.json()["checks"] == {"database": "ok", "broker": "ok", "migrations": "ok"}
        for probe in (healthz, readyz):
            assert "set-cookie" not in probe.headers

        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    samples = scrape(server.url)
    assert sample(samples, "console_metrics_database_up") == 1.0
    assert ("console_pending_reviews", ()) in samples

    # Each of the two workers froze its startup heap once it had loaded the application.
    # The first one up serves the requests above; the other may still be warming its
    # templates on a loaded machine, so its line is waited for.
    def frozen() -> list[str]:
        return re.findall(r"froze (\d+) startup objects", server.output())

    wait_until("both workers to freeze their startup heap", lambda: len(frozen()) >= 2, 60)
    assert len(frozen()) == 2 and all(int(n) > 10_000 for n in frozen()), frozen()

    # One line per request in the access log, with the trace id the console answered with.
    trace = page.headers["X-Trace-Id"]
    lines = [line for line in server.output().splitlines() if f"trace={trace}" in line]
    assert len(lines) == 1 and '"GET /accounts/login/ HTTP/1.1" 200' in lines[0], lines


def test_bin_serve_stops_everything_it_started_on_sigterm(
    serving: tuple[ServerProcess, Path],
) -> None:
    server, _ = serving
    processes = server.descendants()
    commands = {Path(f"/proc/{pid}/cmdline").read_bytes() for pid in processes}
    # gunicorn (master and 2 workers), the Celery worker (master and its pool) and beat.
    assert any(b"gunicorn" in c for c in commands)
    assert any(b"worker" in c for c in commands) and any(b"beat" in c for c in commands)
    assert len(processes) >= 6, commands

    started = time.monotonic()
    assert server.stop(signal.SIGTERM) == 143
    assert time.monotonic() - started < 30
    alive = [pid for pid in processes if running(pid)]
    assert not alive, f"still running after bin/serve stopped: {alive}"
    assert "==> stopped" in server.output()


def test_bin_serve_stops_the_rest_when_one_process_dies(
    serving: tuple[ServerProcess, Path],
) -> None:
    """A supervisor (systemd, a container runtime) sees the exit and restarts the whole
    set, rather than a host left serving without its worker, or without gunicorn."""
    server, _ = serving
    assert server.proc is not None
    processes = server.descendants()
    (master,) = [
        pid
        for pid in children_of(server.proc.pid)
        if b"gunicorn" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    os.kill(master, signal.SIGKILL)  # its workers are orphaned: bin/serve must end them too
    assert server.proc.wait(timeout=60) == 1
    assert "gunicorn stopped by itself" in server.output()
    deadline = time.monotonic() + 5
    while (alive := [p for p in processes if running(p)]) and (time.monotonic() < deadline):
        time.sleep(0.1)
    assert not alive, f"still running after bin/serve stopped: {alive}"


def test_bin_serve_metrics_are_off_without_a_token(
    broker: Broker, transactional_db: Any, tmp_path: Path
) -> None:
    env = production_env(
        broker_url=broker.url,
        static_root=tmp_path / "static",
        PORT=free_port(),
        SERVE_DIR=tmp_path / "serve",
        WEB_CONCURRENCY=1,
    )
    del env["METRICS_TOKEN"]
    server = ServerProcess(
        "bin/serve",
        [SERVE, "--no-install", "--no-worker", "--no-beat"],
        env,
        tmp_path / "serve.log",
    )
    try:
        server.start(ready_path="/readyz")
        for headers in ({}, {"Authorization": f"Bearer {METRICS_TOKEN}"}):
            assert httpx.get(f"{server.url}/metrics", headers=headers).status_code == 404
        assert b"celery" not in b" ".join(
            Path(f"/proc/{pid}/cmdline").read_bytes() for pid in server.descendants()
        )
    finally:
        server.stop()
        release_test_database()


# --- what it refuses ----------------------------------------------------------------------


def test_bin_serve_refuses_development_settings(tmp_path: Path) -> None:
    env = {
        **inherited_env(),
        "DEBUG": "1",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "CELERY_BROKER_URL": "memory://",
        "SERVE_DIR": str(tmp_path / "serve"),
    }
    result = run_serve(env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "refusing to start: DEBUG is on" in result.stderr
    assert "DATABASE_URL must name PostgreSQL" in result.stderr
    assert "CELERY_BROKER_URL is the in-memory broker" in result.stderr
    assert not (tmp_path / "serve").exists(), "it started something"


@pytest.mark.parametrize(
    ("key", "says"),
    [("", "SECRET_KEY is not set"), ("short", "SECRET_KEY is too weak")],
)
def test_bin_serve_refuses_a_missing_or_weak_key(tmp_path: Path, key: str, says: str) -> None:
    env = {
        **inherited_env(),
        "SECRET_KEY": key,
        "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
        "CELERY_BROKER_URL": "redis://127.0.0.1:1/0",
    }
    result = run_serve(env)
    assert result.returncode == 2
    assert f"refusing to start: {says}" in result.stderr


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A PostgreSQL database on the test server with no table at all."""
    settings = connection.settings_dict
    name = f"serve_empty_{uuid.uuid4().hex[:8]}"
    params = {
        "host": settings["HOST"] or "127.0.0.1",
        "port": settings["PORT"] or 5432,
        "user": settings["USER"],
        "password": settings["PASSWORD"] or None,
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = worker_fixture.worker_database_url().rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with psycopg.connect(**params) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_bin_serve_refuses_a_database_with_migrations_not_applied(
    empty_database: str, tmp_path: Path
) -> None:
    env = {
        **inherited_env(),
        "DATABASE_URL": empty_database,
        "CELERY_BROKER_URL": "redis://127.0.0.1:1/0",
        "SERVE_DIR": str(tmp_path / "serve"),
        "STATIC_ROOT": str(tmp_path / "static"),
    }
    result = run_serve(env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "refusing to start: the database has migrations not applied" in result.stderr
    assert "[ ]  approvals.0001_initial" in result.stderr
    assert "bin/serve --migrate" in result.stderr
    assert not (tmp_path / "static").exists(), "it went on to collect static files"
