"""The demo's simulated agent (``manage.py simulate_agent``) as a real process against a
live console and a real sandbox, while this test plays the reviewers (approving and
rejecting through the services) and the worker (delivering console-executed commands)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from approvals.models import AuditEvent, Command, Occurrence, RuntimeKey
from approvals.reviews.decisions import occurrence_reject
from demo.agent.scenario import redact
from reconciliation.dispatch import command_dispatch
from tests.conftest import approve, make_runtime
from tests.demo.sandbox_fixture import ROOT, start_sandbox

pytestmark = pytest.mark.slow  # the sandbox and simulate_agent as processes, for tens of seconds

STEPS = 50
DEADLINE = 60.0


def review(key: RuntimeKey, reviewers: list[Any], seen: list[str]) -> None:
    """Decide every request still pending: the third one is rejected, the rest approved
    (a refund above 500.00 by both reviewers)."""
    pending = Occurrence.objects.filter(
        runtime_key=key, status=Occurrence.Status.PENDING_REVIEW
    ).order_by("created_at")
    for occurrence in pending:
        if str(occurrence.pk) not in seen:
            seen.append(str(occurrence.pk))
        if seen.index(str(occurrence.pk)) == 2:
            occurrence_reject(
                occurrence=occurrence, reviewer=reviewers[0], reason="Outside the refund policy."
            )
            continue
        for reviewer in reviewers:
            if approve(str(occurrence.pk), reviewer).issued:
                break


def deliver() -> None:
    """What the Celery worker does in the demo: deliver each console-executed command
    still pending (again, after a momentary refusal) to its adapter."""
    pending = Command.objects.filter(
        executed_by=Command.ExecutedBy.CONSOLE, state=Command.State.PENDING
    ).values_list("pk", flat=True)
    for command_id in list(pending):
        command_dispatch(command_id=command_id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    # On SQLite the live server and this thread share one in-memory database, and their
    # concurrent writes fail with "database table is locked".
    reason="needs PostgreSQL: the live console and this test write the database at once",
)
def test_the_simulated_agent_walks_every_path_and_never_prints_a_token(
    live_server: Any,
    tenant: Any,
    reviewer: Any,
    second_reviewer: Any,
    settings: Any,
    tmp_path: Path,
) -> None:
    runtime = make_runtime(tenant, "simulated-agent")
    with start_sandbox(tmp_path / "sandbox") as sandbox:
        settings.PAYMENTS_URL = sandbox.url
        settings.PAYMENTS_API_KEY = sandbox.api_key
        settings.MESSAGES_WEBHOOK_URL = f"{sandbox.url}/v1/messages"
        settings.MESSAGES_WEBHOOK_SECRET = sandbox.webhook_secret
        # The sandbox holds a timed-out answer 2 s; give up on it after 1 s.
        settings.ADAPTER_READ_TIMEOUT = 1.0

        env = dict(os.environ, AGENT_KEY=runtime.raw_key, PYTHONUNBUFFERED="1")
        out_path, err_path = tmp_path / "agent.out", tmp_path / "agent.err"
        seen: list[str] = []
        with out_path.open("wb") as out, err_path.open("wb") as err:
            agent = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "simulate_agent",
                    "--url",
                    live_server.url,
                    "--sandbox",
                    sandbox.url,
                    "--interval",
                    "0.2",
                    "--steps",
                    str(STEPS),
                    "--seed",
                    "7",
                    # Every claim misbehaves, so a short run meets each kind of mischief.
                    "--chaos",
                    "1",
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=err,
            )
            deadline = time.monotonic() + DEADLINE
            try:
                while agent.poll() is None:
                    assert time.monotonic() < deadline, "the agent did not finish its steps"
                    review(runtime.key, [reviewer, second_reviewer], seen)
                    deliver()
                    time.sleep(0.1)
            finally:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait()
        deliver()
        refunds = sandbox.refunds()

    output = out_path.read_text()
    errors = err_path.read_text()
    assert agent.returncode == 0, errors
    assert "Traceback" not in output + errors
    # Tokens are named by fingerprint only; the runtime key never appears either.
    assert "apv_" not in output + errors
    assert runtime.raw_key not in output + errors
    assert f"stopped after {STEPS} steps" in output

    occurrences = Occurrence.objects.filter(runtime_key=runtime.key)
    tools = Counter(occurrences.values_list("tool__name", flat=True))
    assert set(tools) == {"issue_refund", "send_message", "lookup_order", "close_case"}, tools
    for line in ("proposed refund", "proposed message", "proposed lookup", "proposed close_case"):
        assert line in output

    commands = Command.objects.filter(occurrence__runtime_key=runtime.key)
    assert commands.filter(executed_by=Command.ExecutedBy.CONSOLE).exists()
    assert "→ approved, executed by console" in output
    assert "→ approved, executed by runtime" in output
    # The runtime reported the effect of a tool it executes itself.
    reported = commands.filter(executed_by=Command.ExecutedBy.RUNTIME).exclude(
        state=Command.State.PENDING
    )
    assert reported.exists()
    assert "reported close_case" in output

    # The mischief, as the console recorded it.
    events = AuditEvent.objects.filter(tenant=tenant)
    assert events.filter(kind="claim.replayed").exists()
    assert "→ replayed (403)" in output
    assert events.filter(kind="claim.duplicate_delivery").exists()
    assert "→ duplicate_delivery (200), same command" in output
    assert "sandbox fault" in output
    # The rejected request was dropped, not claimed.
    assert " rejected: Outside the refund policy." in output
    assert not commands.filter(occurrence__status=Occurrence.Status.REJECTED).exists()

    # Each committed refund happened once at the sandbox, under its command's key.
    keys = Counter(refund["idempotency_key"] for refund in refunds)
    assert all(count == 1 for count in keys.values()), keys
    refund_commands = commands.filter(occurrence__tool__name="issue_refund")
    committed = set(
        refund_commands.filter(state=Command.State.COMMITTED).values_list(
            "idempotency_key", flat=True
        )
    )
    assert committed, "no refund was executed"
    assert committed <= set(keys)
    assert set(keys) <= set(refund_commands.values_list("idempotency_key", flat=True))


def test_output_redacts_anything_shaped_like_a_secret() -> None:
    line = "echo apv_abc-DEF_123 and rk_xyz; fingerprint 06f45ebe3f52737d"
    assert redact(line) == "echo apv_<redacted> and rk_<redacted>; fingerprint 06f45ebe3f52737d"


def _demo_copy(tmp_path: Path) -> Path:
    """bin/demo and what it sources, alone in an empty tree: anything it creates shows."""
    (tmp_path / "bin").mkdir()
    for name in ("demo", "_venv.sh"):
        shutil.copy2(ROOT / "bin" / name, tmp_path / "bin" / name)
    return tmp_path / "bin" / "demo"


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_demo_help_prints_usage_and_does_nothing(tmp_path: Path, flag: str) -> None:
    demo = _demo_copy(tmp_path)
    before = _tree(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in {"DEMO_DIR", "DATABASE_URL"}}

    result = subprocess.run(
        ["bash", str(demo), flag], capture_output=True, text=True, env=env, timeout=20
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: bin/demo [PORT] [--no-agent]")
    assert "--no-agent" in result.stdout
    assert result.stderr == ""
    assert _tree(tmp_path) == before


def test_demo_refuses_an_unknown_option_before_doing_anything(tmp_path: Path) -> None:
    demo = _demo_copy(tmp_path)
    before = _tree(tmp_path)

    result = subprocess.run(
        ["bash", str(demo), "--bogus"], capture_output=True, text=True, timeout=20
    )

    assert result.returncode == 2
    assert "unknown option --bogus" in result.stderr
    assert _tree(tmp_path) == before
