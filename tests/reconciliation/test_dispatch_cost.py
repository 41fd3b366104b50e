"""Issue 28, the worker beside the web tier: what one command's delivery costs the worker.

A first delivery that the remote commits makes the statements pinned below, phase by
phase (inside the test's transaction a phase's transaction is a SAVEPOINT and its RELEASE;
in the worker, BEGIN and COMMIT): a statement added to any phase fails here and says
which. The adapters' calls share one HTTP client per process: no call builds a client, a
connection pool or a TLS context of its own (loading the CA bundle was most of a
delivery's CPU, ``bench/README.md``).
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import AuditEvent, Command
from approvals.outbound import client as outbound
from reconciliation.adapters.base import http_client
from reconciliation.dispatch import command_dispatch
from reconciliation.models import AdapterInvocation
from tests.approvals.test_hot_path import statement
from tests.conftest import Runtime
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation.conftest import claim_command

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the statements pinned are PostgreSQL's"
    ),
]

# Phase 1: lock the command (with its contract and proposal), the occurrence's current
# epoch, the earlier invocations in one aggregate (the last number, the attempts, any left
# unfinished), the clock; then the invocation row, the effect ``sending`` and its event.
BEGIN = [
    "SAVEPOINT",
    "SELECT approvals_command",
    "SELECT approvals_epoch",
    "SELECT reconciliation_adapterinvocation",
    "SELECT CURRENT_TIMESTAMP",
    "INSERT reconciliation_adapterinvocation",
    "UPDATE approvals_command",
    "INSERT approvals_auditevent",
    "RELEASE",
]
# Phase 2, the call: the tenant's credential for the adapter, nothing of the command again.
CALL = ["SELECT reconciliation_adaptercredential"]
# Phase 3: lock the command, close the invocation unless another delivery closed it (the
# UPDATE's row count says which), the current epoch, the effect ``committed`` and its event.
RECORD = [
    "SAVEPOINT",
    "SELECT approvals_command",
    "UPDATE reconciliation_adapterinvocation",
    "SELECT approvals_epoch",
    "UPDATE approvals_command",
    "INSERT approvals_auditevent",
    "RELEASE",
]


def test_a_committed_delivery_makes_its_pinned_statements(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)

    with CaptureQueriesContext(connection) as queries:
        command_dispatch(command_id=command.pk, message_id="msg-1")

    shapes = [statement(q["sql"]) for q in queries.captured_queries]
    assert shapes == BEGIN + CALL + RECORD, "\n".join(q["sql"][:160] for q in queries)
    # What the statements wrote is the whole evidence, as before.
    command.refresh_from_db()
    assert command.state == Command.State.COMMITTED
    [invocation] = AdapterInvocation.objects.filter(command=command)
    [refund] = remote.refunds()
    assert (invocation.outcome, invocation.receipt) == ("committed", refund["id"])
    assert invocation.finished_at is not None and invocation.message_id == "msg-1"
    assert refund["idempotency_key"] == command.idempotency_key
    events = AuditEvent.objects.filter(command_id=command.pk).order_by("id")
    assert [(e.kind, e.message_id) for e in events][-2:] == [
        ("effect.sending", "msg-1"),
        ("effect.committed", "msg-1"),
    ]


def test_deliveries_share_the_process_client_and_build_no_tls_context(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = (claim_command(runtime, reviewer, ref=f"call-{i}") for i in (1, 2))
    command_dispatch(command_id=first.pk)  # the process's client exists from here on
    built: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append("tls context")
        return create(*args, **kwargs)

    create = httpx.create_ssl_context
    monkeypatch.setattr(httpx, "create_ssl_context", counted)
    monkeypatch.setattr(httpx, "Client", _refused(httpx.Client))

    command_dispatch(command_id=second.pk)

    second.refresh_from_db()
    assert second.state == Command.State.COMMITTED
    assert built == []
    assert len(remote.refunds()) == 2


def _refused(real: type) -> Any:
    """``httpx.Client`` for a test in which no client may be built."""

    def build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a delivery built an HTTP client of its own")

    return build


def test_the_process_client_is_one_per_process_and_configuration(settings: Any) -> None:
    assert http_client() is http_client()
    settings.ADAPTER_READ_TIMEOUT = settings.ADAPTER_READ_TIMEOUT + 1
    assert http_client() is not outbound.pooled_client(public_only=True)
    changed = http_client()
    settings.ADAPTER_READ_TIMEOUT = settings.ADAPTER_READ_TIMEOUT - 1
    assert http_client() is not changed, "a changed timeout gets a client of its own"

    # A forked worker process builds its own: it never shares its parent's sockets.
    read, write = os.pipe()
    parent = id(http_client())
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, b"1" if id(http_client()) != parent else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
