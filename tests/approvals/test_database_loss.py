"""Issue 9, finding 5: the database goes away, for real, and comes back.

Before: with the database gone every endpoint answered 500 ``server_error``, and with
persistent connections the first request after it came back failed too. Now the API answers
``503 database_unavailable`` with ``Retry-After``, the console a plain "temporarily
unavailable" page (rendered without touching the database), the JSON log has the traceback
under the trace id the client got in ``X-Trace-Id``, and the first request after the
database returns succeeds (``CONN_HEALTH_CHECKS``).

The test starts its own throwaway PostgreSQL cluster (as ``bin/test`` does) and the console
as a separate ``runserver`` process with one thread and persistent connections, then stops
the cluster under it and starts it again: no exception is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REFUND_ARGS

pytestmark = pytest.mark.slow  # a PostgreSQL cluster of its own, stopped and started again

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def postgres_bindir() -> Path | None:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return candidates[-1].parent if candidates else None


class ThrowawayPostgres:
    """A PostgreSQL cluster of this test's own, on a free port; stop() and start() it."""

    def __init__(self, bindir: Path, tmp: Path) -> None:
        self.bindir = bindir
        self.tmp = tmp
        self.port = free_port()
        self.data = tmp / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            shutil.chown(tmp, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync")  # fmt: skip
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "console")
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/console"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.tmp} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.tmp / "server.log"), "-w",
                  "-t", "60", "-o", options, "start")  # fmt: skip

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m",
             "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )  # fmt: skip


@pytest.fixture
def postgres() -> Iterator[ThrowawayPostgres]:
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip("needs PostgreSQL's server binaries (Debian package postgresql; bin/test)")
    # Directly in /tmp: as root, the cluster runs as postgres, who cannot enter pytest's
    # private temporary directories.
    tmp = Path(tempfile.mkdtemp(prefix="console-pg-loss."))
    try:
        cluster = ThrowawayPostgres(bindir, tmp)
        try:
            yield cluster
        finally:
            cluster.destroy()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class Console:
    """``manage.py runserver`` in one thread, so one persistent database connection serves
    every request, as in a gunicorn sync worker."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", "--nothreading",
             f"127.0.0.1:{self.port}"],
            cwd=ROOT,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.base + "/accounts/login/", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log_file.close()

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log.read_text(errors="replace").splitlines():
            if raw.startswith("{"):
                try:
                    lines.append(json.loads(raw))
                except json.JSONDecodeError:
                    continue
        return lines


@pytest.fixture
def console(
    postgres: ThrowawayPostgres, tmp_path: Path
) -> Iterator[tuple[Console, dict[str, str]]]:
    env = {
        **os.environ,
        "DATABASE_URL": postgres.url,
        "CONN_MAX_AGE": "600",
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        # Plain HTTP on the loopback: cookies without the Secure flag, or httpx keeps them.
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
        "SECURE_SSL_REDIRECT": "0",
        "CELERY_BROKER_URL": "memory://",
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }
    password = "loss-test-" + os.urandom(8).hex()
    manage(env, "migrate", "--no-input", "-v", "0")
    manage(env, "create_tenant", "acme")
    key = manage(env, "create_runtime_key", "acme", "agent").strip().splitlines()[-1]
    manage({**env, "RITA_PASSWORD": password}, "add_member", "acme", "rita", "--role",
           "reviewer", "--password-env", "RITA_PASSWORD")  # fmt: skip
    server = Console(env, tmp_path / "console.log")
    try:
        yield server, {"key": key, "password": password}
    finally:
        server.stop()


def sign_in(base: str, password: str) -> httpx.Client:
    browser = httpx.Client(base_url=base, headers={"Connection": "close"}, timeout=10)
    browser.get("/accounts/login/")
    response = browser.post(
        "/accounts/login/",
        data={
            "username": "rita",
            "password": password,
            "csrfmiddlewaretoken": browser.cookies["csrftoken"],
        },
    )
    assert response.status_code == 302, response.text
    return browser


def test_the_database_goes_away_and_comes_back(
    postgres: ThrowawayPostgres, console: tuple[Console, dict[str, str]]
) -> None:
    server, secrets = console
    agent = httpx.Client(
        base_url=server.base,
        headers={"Authorization": f"Bearer {secrets['key']}", "Connection": "close"},
        timeout=10,
    )
    browser = sign_in(server.base, secrets["password"])
    proposal = {
        "tool": "issue_refund",
        "arguments": REFUND_ARGS,
        "run_id": "run-1",
        "reason": "before the outage",
    }
    proposed = agent.post("/api/v1/occurrences", json=proposal)
    assert proposed.status_code == 201, proposed.text
    occurrence = proposed.json()["occurrence_id"]
    assert agent.get(f"/api/v1/occurrences/{occurrence}").status_code == 200
    assert browser.get("/reviews/").status_code == 200

    # A restart between two requests leaves the console's persistent connection dead
    # without its knowing: the first request after it is checked and reconnects, on the
    # API and in the console alike.
    postgres.stop()
    postgres.start()
    assert agent.get(f"/api/v1/occurrences/{occurrence}").status_code == 200
    postgres.stop()
    postgres.start()
    assert browser.get("/reviews/").status_code == 200

    postgres.stop()

    # The API: 503 database_unavailable with Retry-After, whatever the endpoint.
    down = agent.get(f"/api/v1/occurrences/{occurrence}", headers={"X-Trace-Id": "loss-api-1"})
    assert down.status_code == 503
    assert down.json()["error"]["code"] == "database_unavailable"
    assert down.headers["Retry-After"] == "5"
    assert "no-store" in down.headers["Cache-Control"]
    assert down.headers["X-Trace-Id"] == "loss-api-1"
    for attempt in [
        agent.post("/api/v1/occurrences", json={**proposal, "client_ref": "during-outage"}),
        agent.post(
            "/api/v1/claims",
            json={
                "token": "apv_" + "x" * 43,
                "action": {"tool": "issue_refund", "arguments": REFUND_ARGS},
                "execution_id": "exec-a",
            },
        ),
    ]:
        assert attempt.status_code == 503, attempt.text
        assert attempt.json()["error"]["code"] == "database_unavailable"
        assert attempt.headers["Retry-After"] == "5"

    # The console: a plain page, rendered without the database.
    page = browser.get("/reviews/", headers={"X-Trace-Id": "loss-page-1"})
    assert page.status_code == 503
    assert page.headers["Content-Type"].startswith("text/html")
    assert "Temporarily unavailable" in page.text
    assert "cannot reach its database" in page.text
    assert page.headers["Retry-After"] == "5"
    assert "no-store" in page.headers["Cache-Control"]
    assert page.headers["X-Trace-Id"] == "loss-page-1"

    # The JSON log has each failure's traceback under the trace id the client saw.
    lines = server.log_lines()
    for trace_id in ["loss-api-1", "loss-page-1"]:
        logged = [line for line in lines if line.get("trace_id") == trace_id]
        assert logged, f"no log line with trace id {trace_id}"
        errors = [line for line in logged if line.get("level") == "error"]
        assert errors, logged
        assert any(
            "Traceback" in line.get("exception", "") and "OperationalError" in line["exception"]
            for line in errors
        ), errors

    postgres.start()

    # The very first request after the database is back succeeds: the persistent
    # connection is checked and replaced instead of failing once more.
    assert agent.get(f"/api/v1/occurrences/{occurrence}").status_code == 200
    assert browser.get("/reviews/").status_code == 200
    # Nothing was written while the database was gone, and nothing half-way.
    again = agent.post("/api/v1/occurrences", json={**proposal, "client_ref": "during-outage"})
    assert again.status_code == 201  # a new occurrence: the 503'd proposal left no row
