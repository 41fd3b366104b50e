"""bin/demo as a newcomer runs it: the installer's noise is kept back unless it fails, and
once everything is up the accounts to sign in with are the last lines on screen."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.demo.sandbox_fixture import ROOT
from tests.gateway.conftest import in_thread


def _bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"source bin/_venv.sh && {script}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_quietly_keeps_a_commands_output_back_unless_it_fails() -> None:
    quiet = _bash("quietly bash -c 'echo WARNING: a banner; echo noise >&2'; echo status=$?")
    assert quiet.stdout == "status=0\n" and quiet.stderr == ""

    loud = _bash("quietly bash -c 'echo ERROR: no such package; exit 3' || echo status=$?")
    assert loud.stdout == "status=3\n"
    assert loud.stderr == "ERROR: no such package\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _gateway_tools(url: str) -> list[str]:
    async with (
        streamable_http_client(url) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        return [t.name for t in (await session.list_tools()).tools]


@pytest.mark.slow
def test_the_demo_ends_its_output_with_the_accounts(tmp_path: Path) -> None:
    port, sandbox_port, gateway_port = _free_port(), _free_port(), _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k not in {"CELERY_BROKER_URL", "REDIS_URL"}},
        "DEMO_DIR": str(tmp_path / "demo"),
        "SANDBOX_PORT": str(sandbox_port),
        "GATEWAY_PORT": str(gateway_port),
        "DATABASE_URL": f"sqlite:///{tmp_path}/demo.sqlite3?timeout=20"
        "&transaction_mode=IMMEDIATE&init_command=PRAGMA%20journal_mode%3DWAL",
    }
    demo = subprocess.Popen(
        ["bin/demo", str(port), "--no-agent"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = demo.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if line.startswith("  export KEY=") and "==> the demo's accounts" in lines:
                break
        # The MCP gateway serves the demo shop's tools (docs/mcp-gateway.md).
        tools = in_thread(_gateway_tools(f"http://127.0.0.1:{gateway_port}/mcp")).result()
        # Nothing follows the accounts: no log is followed without --follow.
        time.sleep(3)
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        rest, _ = demo.communicate(timeout=60)
    assert "==> the demo's accounts" in lines, "\n".join(lines)
    accounts = lines[lines.index("==> the demo's accounts") :]
    assert any(line.split()[:1] == ["reviewer"] for line in accounts), accounts
    assert any(line.split()[:1] == ["operator"] for line in accounts), accounts
    assert f"http://127.0.0.1:{port}/" in "\n".join(accounts)
    assert f"http://127.0.0.1:{gateway_port}/mcp" in "\n".join(lines)
    assert {"shop__lookup_order", "shop__issue_refund", "shop__send_message"} <= set(tools)
    assert rest.lstrip().startswith("==> stopping the demo"), rest
    # The installer's warnings and banners stay back.
    assert not [line for line in lines if line.startswith(("WARNING:", "Requirement "))]
