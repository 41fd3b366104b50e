"""The sandbox payments service as a real process, for any test that needs a remote to call.

Use the fixture by binding it in a test module (an assignment, not ``from ... import
sandbox_server``, which ruff reports as F401/F811 once a test takes it as an argument)::

    from tests.demo import sandbox_fixture
    from tests.demo.sandbox_fixture import SandboxProcess

    sandbox_server = sandbox_fixture.sandbox_server

    def test_refund_is_created_once(sandbox_server: SandboxProcess) -> None:
        ...call sandbox_server.url with sandbox_server.api_key...
        assert len(sandbox_server.refunds()) == 1

(or register it once in a conftest), or start one directly:
``with start_sandbox(tmp_path, hold_seconds=30) as sandbox: ...``.
"""

from __future__ import annotations

import base64
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk_sandbox_test"
# The secret the sandbox verifies messages with; the console's MESSAGES_WEBHOOK_SECRET in
# the tests that send it messages. Spelled as Standard Webhooks spells one.
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"sandbox webhook secret for tests!").decode()
# Short enough to keep tests quick, longer than the 1 s read timeout tests give their clients.
HOLD_SECONDS = 2.0
START_TIMEOUT = 20.0
LISTENING = "sandbox payments on "


class SandboxProcess:
    """A running ``manage.py run_sandbox_payments`` and a client for its control endpoints."""

    def __init__(
        self, workdir: Path, *, api_key: str = API_KEY, hold_seconds: float = HOLD_SECONDS
    ) -> None:
        self.workdir = workdir
        self.data = workdir / "payments.json"
        self.api_key = api_key
        self.webhook_secret = WEBHOOK_SECRET
        self.hold_seconds = hold_seconds
        self.port = 0
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: httpx.Client | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the process (on the same port after a stop) and wait until it listens."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        out = self.workdir / "sandbox.out"
        out.write_text("")
        env = dict(os.environ)
        # The sandbox needs no secret, but the settings module refuses to load without one
        # outside DEBUG; a throwaway key keeps this process independent of the caller's env.
        env.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
        with out.open("wb") as stdout, (self.workdir / "sandbox.err").open("ab") as stderr:
            # Files, not pipes: nobody reads the pipe after the first line, and a full pipe
            # would block the server.
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "run_sandbox_payments",
                    "--port",
                    str(self.port),
                    "--data",
                    str(self.data),
                    "--api-key",
                    self.api_key,
                    "--hold-seconds",
                    str(self.hold_seconds),
                    "--webhook-secret",
                    self.webhook_secret,
                ],
                cwd=ROOT,
                env=env,
                stdout=stdout,
                stderr=stderr,
            )
        self.url = self._wait_for_url(out)
        self.port = int(self.url.rsplit(":", 1)[1])
        self._client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(5.0))

    def _wait_for_url(self, out: Path) -> str:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            line, newline, _ = out.read_text().partition("\n")
            if newline and line.startswith(LISTENING):
                return line.removeprefix(LISTENING).strip()
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        err = (self.workdir / "sandbox.err").read_text()
        raise RuntimeError(f"the sandbox did not start:\n{err}")

    def stop(self) -> int | None:
        """SIGTERM and wait; return the exit status (None if it was not running)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def restart(self) -> None:
        """Stop and start again on the same port and data file."""
        self.stop()
        self.start()

    def kill(self) -> None:
        """SIGKILL: the sandbox dies without any chance to tidy up."""
        assert self._proc is not None
        self._proc.kill()
        self._proc.wait()
        self.stop()

    # -- control endpoints -----------------------------------------------------------------

    @property
    def client(self) -> httpx.Client:
        assert self._client is not None, "the sandbox is not running"
        return self._client

    def _get(self, path: str) -> Any:
        response = self.client.get(path)
        response.raise_for_status()
        return response.json()

    def requests(self) -> list[dict[str, Any]]:
        """Every /v1 request received, in order: method, path, idempotency_key, status, fault."""
        return list(self._get("/_sandbox/requests"))

    def refunds(self) -> list[dict[str, Any]]:
        return list(self._get("/_sandbox/refunds"))

    def messages(self) -> list[dict[str, Any]]:
        return list(self._get("/_sandbox/messages"))

    def fault(self, mode: str | None, times: int = 1) -> None:
        """Make the next ``times`` POSTs under /v1 misbehave (mode None or times 0 clears it)."""
        self.client.post("/_sandbox/faults", json={"mode": mode, "times": times}).raise_for_status()

    def reset(self) -> None:
        self.client.post("/_sandbox/reset").raise_for_status()


@contextmanager
def start_sandbox(workdir: Path, **options: Any) -> Iterator[SandboxProcess]:
    sandbox = SandboxProcess(workdir, **options)
    sandbox.start()
    try:
        yield sandbox
    finally:
        sandbox.stop()


@pytest.fixture
def sandbox_server(tmp_path: Path) -> Iterator[SandboxProcess]:
    """A fresh sandbox process with its own data file, stopped after the test."""
    with start_sandbox(tmp_path / "sandbox") as sandbox:
        yield sandbox
