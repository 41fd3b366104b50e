"""Fixtures for execution: the real sandbox service, adapters pointed at it, and commands
claimed through the real API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from approvals.models import Command
from tests.conftest import REFUND_ARGS, Runtime, approve
from tests.demo.sandbox_fixture import SandboxProcess, start_sandbox

MESSAGE_ARGS: dict[str, Any] = {
    "to": "customer@example.com",
    "subject": "Your refund",
    "body": "We refunded your parcel.",
}
CASE_ARGS: dict[str, Any] = {"case_id": "case_77"}
ARGS = {"issue_refund": REFUND_ARGS, "send_message": MESSAGE_ARGS, "close_case": CASE_ARGS}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    """One sandbox process per test module, emptied before each test that uses it."""
    with start_sandbox(tmp_path_factory.mktemp("sandbox")) as process:
        yield process


@pytest.fixture
def remote(sandbox: SandboxProcess, settings: Any) -> SandboxProcess:
    """The adapters call the sandbox; a call that gets no answer within 1 s is unknown."""
    sandbox.reset()
    settings.PAYMENTS_URL = sandbox.url
    settings.PAYMENTS_API_KEY = sandbox.api_key
    settings.MESSAGES_WEBHOOK_URL = f"{sandbox.url}/v1/messages"
    settings.MESSAGES_WEBHOOK_SECRET = sandbox.webhook_secret
    settings.ADAPTER_READ_TIMEOUT = 1.0
    return sandbox


def claim_command(
    runtime: Runtime,
    reviewer: Any,
    tool: str = "issue_refund",
    arguments: dict[str, Any] | None = None,
    *,
    execution_id: str = "exec-1",
    ref: str = "",
) -> Command:
    """Propose, approve, pick up and claim: the command the claim created."""
    arguments = dict(ARGS[tool] if arguments is None else arguments)
    fields = {"client_ref": ref} if ref else {}
    proposed = runtime.propose(tool=tool, arguments=arguments, **fields)
    assert proposed.status_code == 201, proposed.content
    occurrence_id = proposed.json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    token = runtime.token(occurrence_id).json()["token"]
    claimed = runtime.claim(token, execution_id, tool=tool, arguments=arguments)
    assert claimed.status_code == 200, claimed.content
    return Command.objects.get(pk=claimed.json()["command_id"])
