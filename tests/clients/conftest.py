"""A live console (pytest-django's ``live_server``, real HTTP on PostgreSQL) and the Python
client pointed at it. Reviewers decide through ``approvals.services``, as the review pages
do (there is no reviewer API yet)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from approval_console import ApprovalConsole, AsyncApprovalConsole, RetryPolicy
from django.utils import timezone

from approvals.models import Approval, AuditEvent, Command, Occurrence
from approvals.reviews.decisions import occurrence_reject, proposal_edit
from tests.conftest import Runtime, approve
from tests.demo.sandbox_fixture import SandboxProcess, start_sandbox

CASE_ARGS: dict[str, Any] = {"case_id": "case_77"}

T = TypeVar("T")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` in a thread of its own. In the whole suite, the browser tests'
    Playwright (sync API) keeps an event loop running on the main thread for the session,
    and ``asyncio.run`` refuses to start inside a running loop."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class Sleeps:
    """The client's sleep: records each wait instead of waiting, and runs ``then`` (a
    reviewer deciding) at the first one."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.then: Callable[[], object] | None = None

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.then is not None:
            then, self.then = self.then, None
            then()


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def console(live_server: Any, runtime: Runtime, sleeps: Sleeps) -> Iterator[ApprovalConsole]:
    with ApprovalConsole(
        live_server.url, runtime.raw_key, sleep=sleeps, retry=RetryPolicy(max_retries=2)
    ) as client:
        yield client


@pytest.fixture
def console_factory(live_server: Any, runtime: Runtime) -> Iterator[Callable[..., ApprovalConsole]]:
    """A new client (of ``cls``) each call: what a restarted process builds. Each is closed
    at the end: a kept-alive connection would keep a live-server thread, and its database
    connection, open past the test."""
    made: list[ApprovalConsole] = []

    def make(cls: type[ApprovalConsole] = ApprovalConsole) -> ApprovalConsole:
        made.append(cls(live_server.url, runtime.raw_key))
        return made[-1]

    yield make
    for client in made:
        client.close()


@pytest.fixture
def async_console_factory(live_server: Any, runtime: Runtime) -> Callable[[], AsyncApprovalConsole]:
    async def no_sleep(seconds: float) -> None:
        return None

    return lambda: AsyncApprovalConsole(live_server.url, runtime.raw_key, sleep=no_sleep)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    """One sandbox payments service per test module, emptied before each test using it."""
    with start_sandbox(tmp_path_factory.mktemp("sandbox")) as process:
        yield process


@pytest.fixture
def payments(sandbox: SandboxProcess, settings: Any) -> SandboxProcess:
    """The console's adapters call the sandbox (a call unanswered in 1 s is unknown), so
    console-executed refunds and messages have real effects to count."""
    sandbox.reset()
    settings.PAYMENTS_URL = sandbox.url
    settings.PAYMENTS_API_KEY = sandbox.api_key
    settings.MESSAGES_WEBHOOK_URL = f"{sandbox.url}/v1/messages"
    settings.MESSAGES_WEBHOOK_SECRET = sandbox.webhook_secret
    settings.ADAPTER_READ_TIMEOUT = 1.0
    return sandbox


def reject(occurrence_id: str, reviewer: Any, reason: str) -> None:
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason=reason
    )


def edit(occurrence_id: str, reviewer: Any, arguments: dict[str, Any]) -> None:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    digest = occurrence.proposals.get(is_current=True).action_digest
    proposal_edit(occurrence=occurrence, editor=reviewer, arguments=arguments, seen_digest=digest)


def expire(occurrence_id: str) -> None:
    """The run paused past the approval's lifetime: its expiry moves into the past."""
    past = timezone.now() - timedelta(minutes=1)
    moved = Approval.objects.filter(occurrence_id=occurrence_id, proposal__is_current=True).update(
        issued_at=past - timedelta(minutes=15), expires_at=past
    )
    assert moved == 1


def commands_of(occurrence_id: str) -> list[Command]:
    return list(Command.objects.filter(occurrence_id=occurrence_id))


def audit_kinds(occurrence_id: str) -> list[str]:
    return list(
        AuditEvent.objects.filter(occurrence_id=occurrence_id)
        .order_by("pk")
        .values_list("kind", flat=True)
    )


__all__ = ["CASE_ARGS", "Sleeps", "approve", "audit_kinds", "commands_of", "edit", "expire"]
