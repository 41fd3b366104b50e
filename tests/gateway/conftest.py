"""The MCP gateway as a real process (``manage.py mcp_gateway``) on the pytest-django test
database, in front of the demo MCP server (``demo.mcp_shop``, written with the ``mcp``
SDK), which appends every call it receives to a ledger file: the tests count its lines.

MCP clients are asynchronous. Every test here is a plain (sync) function that runs its
client with ``asyncio.run`` in a thread of its own (``in_thread``), so that no event loop
ever runs on, or is left set for, pytest's main thread, where the browser tests' sync
Playwright must be free to start its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from approvals.models import Membership, Occurrence, Tenant
from tests.conftest import Runtime, make_runtime, make_user
from tests.demo.sandbox_fixture import ROOT
from tests.reconciliation.worker_fixture import wait_until, worker_database_url

T = TypeVar("T")
START_TIMEOUT = 90.0


class InThread(Generic[T]):
    """A coroutine run by ``asyncio.run`` in a thread of its own; ``result()`` joins it."""

    def __init__(self, coroutine: Coroutine[Any, Any, T]) -> None:
        self._coroutine = coroutine
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = asyncio.run(self._coroutine)
        except BaseException as exc:
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 120.0) -> T:
        self._thread.join(timeout)
        if self._thread.is_alive():
            pytest.fail(f"the MCP client did not finish within {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


def in_thread(coroutine: Coroutine[Any, Any, T]) -> InThread[T]:
    return InThread(coroutine)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Ledger:
    """The demo MCP server's record of the calls that reached it."""

    path: Path

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [r for r in rows if tool is None or r["tool"] == tool]


@dataclass
class GatewayProcess:
    """``manage.py mcp_gateway`` as a child process (its own process group)."""

    config: Path
    env: dict[str, str]
    log: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, **env: str) -> None:
        self.starts += 1
        log = self.log.with_suffix(f".{self.starts}.log")
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "mcp_gateway", "--config", str(self.config)],
                cwd=ROOT,
                env={**self.env, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until("the gateway to listen", lambda: self._listening(log), timeout=START_TIMEOUT)

    def _listening(self, log: Path) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"the gateway stopped:\n{log.read_text()[-3000:]}")
        return "tools at http://" in log.read_text()

    def wait_dead(self, timeout: float = 60.0) -> int:
        """Wait for the process to end by itself (a crash point); its exit status."""
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(20)

    def output(self) -> str:
        return "\n".join(
            p.read_text() for p in sorted(self.log.parent.glob(f"{self.log.stem}.*.log"))
        )


@dataclass
class Setup:
    tenant: Tenant
    runtime: Runtime
    reviewer: Any
    ledger: Ledger
    gateway: GatewayProcess
    write_config: Callable[..., None] = field(repr=False)


TOML = """\
[gateway]
name = "{name}"
port = {port}
console_url = "{console_url}"
poll_seconds = 0.2
progress_seconds = 0.5

[upstreams.shop]
command = ["{python}", "-m", "demo.mcp_shop", "--ledger", "{ledger}"]
cwd = "{root}"
tenant = "{tenant}"
runtime_key_env = "SHOP_RUNTIME_KEY"
{extra}
"""


@pytest.fixture
def gateway_setup(transactional_db: Any, tmp_path: Path) -> Iterator[Setup]:
    """A tenant with a reviewer and a runtime key, a gateway config for the demo MCP
    server, and the gateway process (started by the test: ``setup.gateway.start()``)."""
    from approvals.access.tenancy import tenant_create

    tenant = tenant_create(slug="shop", name="Shop")
    runtime = make_runtime(tenant, "mcp-gateway")
    reviewer = make_user("rita", tenant, Membership.Role.REVIEWER)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    config = tmp_path / "gateway.toml"
    port = free_port()

    def write_config(extra: str = "", console_url: str = "http://127.0.0.1:8000") -> None:
        config.write_text(
            TOML.format(
                name=f"test-{port}",
                port=port,
                console_url=console_url,
                python=sys.executable,
                ledger=ledger.path,
                root=ROOT,
                tenant=tenant.slug,
                extra=extra,
            )
        )

    write_config()
    env = {
        **os.environ,
        "DATABASE_URL": worker_database_url(),
        "SHOP_RUNTIME_KEY": runtime.raw_key,
        "CONSOLE_DEMO": "1",
        "PYTHONUNBUFFERED": "1",
    }
    gateway = GatewayProcess(config=config, env=env, log=tmp_path / "gateway", port=port)
    setup = Setup(tenant, runtime, reviewer, ledger, gateway, write_config)
    try:
        yield setup
    finally:
        gateway.stop()
        # Shown by pytest when the test failed: the gateway's own account of it.
        print(gateway.output()[-6000:])


def pending_occurrence(tool: str, timeout: float = 60.0) -> Occurrence:
    """Wait for the gateway's proposal of ``tool`` and return it."""
    found: list[Occurrence] = []

    def proposed() -> bool:
        found[:] = list(Occurrence.objects.filter(tool__name=tool))
        return bool(found)

    wait_until(f"a proposal of {tool}", proposed, timeout=timeout)
    return found[0]
