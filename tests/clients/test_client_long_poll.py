"""The Python client in long-poll mode against the console as bin/serve runs it (gunicorn's
asgi worker, config/asgi.py): 100 waiters, each woken by its own decision, approved or
rejected, with the reason; no client sleeps between asks, and the server reads each
occurrence about twice per waiter instead of once per poll interval."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from approval_console import AsyncApprovalConsole
from django.db import connection

from tests.clients.conftest import CASE_ARGS, reject, run_async
from tests.conftest import approve, make_runtime
from tests.serve.servers import ServerProcess, asgi_server, sample, scrape, wait_for_sample

__all__ = ["asgi_server"]  # a fixture

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the ASGI server's wake-ups need PostgreSQL"
    ),
]

WAITERS = 100


def test_100_long_polling_clients_are_woken_by_their_decisions(
    asgi_server: ServerProcess, tenant: Any, reviewer: Any
) -> None:
    runtime = make_runtime(tenant, "crowd")
    slept: list[float] = []

    async def no_sleep(seconds: float) -> None:
        slept.append(seconds)

    async def propose_all() -> list[str]:
        async with AsyncApprovalConsole(asgi_server.url, runtime.raw_key) as console:
            return [
                (
                    await console.propose(
                        "close_case",
                        CASE_ARGS,
                        run_id=f"run-{i}",
                        reason="Resolved by phone.",
                        client_ref="call_0",
                    )
                ).occurrence_id
                for i in range(WAITERS)
            ]

    ids = run_async(propose_all())
    assert len(set(ids)) == WAITERS  # call_0 in 100 runs: 100 occurrences
    outcomes: dict[str, tuple[str, str | None, float]] = {}
    reads_before = sample(scrape(asgi_server.url), "console_long_poll_reads_total")

    async def wait_all() -> None:
        async def one(occurrence_id: str) -> None:
            async with AsyncApprovalConsole(
                asgi_server.url, runtime.raw_key, long_poll=True, sleep=no_sleep
            ) as console:
                occurrence = await console.wait(occurrence_id, timeout=120)
                outcomes[occurrence_id] = (
                    occurrence.status,
                    occurrence.rejection_reason,
                    time.time(),
                )

        await asyncio.gather(*(one(i) for i in ids))

    waiting = threading.Thread(target=run_async, args=(wait_all(),))
    waiting.start()
    decided: dict[str, float] = {}
    try:
        wait_for_sample(
            asgi_server.url, "console_long_poll_waiting", lambda n: n >= WAITERS, timeout=30
        )
        for n, occurrence_id in enumerate(ids):
            if n % 2:
                reject(occurrence_id, reviewer, f"Not case {n}.")
            else:
                assert approve(occurrence_id, reviewer).issued
            decided[occurrence_id] = time.time()
    finally:
        waiting.join(timeout=120)
    assert not waiting.is_alive()
    for n, occurrence_id in enumerate(ids):
        status, reason, at = outcomes[occurrence_id]
        if n % 2:
            assert (status, reason) == ("rejected", f"Not case {n}.")
        else:
            assert (status, reason) == ("approved", "")
        assert at - decided[occurrence_id] < 1.0, (n, at - decided[occurrence_id])
    assert slept == []
    reads = sample(scrape(asgi_server.url), "console_long_poll_reads_total") - reads_before
    assert reads <= 2 * WAITERS + 10, reads
