"""Racing OS processes released together by a barrier: the house pattern for proving that a
guard holds between processes (a process-local lock would prove nothing).

A ``Pool`` keeps forked worker processes (one database connection each) alive across
rounds; ``run`` hands each one a job and releases them at once. Jobs are module-level
functions (pickled by name) and their keyword arguments; a job that raises is reported as
``("crashed", "<exception>")``, which the test then fails on.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from typing import Any

import pytest
from django.db import connection, connections

TIMEOUT = 60

# Every race test module's marks: ``pytestmark = RACE`` (``[*RACE, pytest.mark.slow]``).
RACE = [
    pytest.mark.race,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="races run on PostgreSQL, in OS processes"
    ),
]

Job = tuple[Callable[..., Any], dict[str, Any]]


def _worker(index: int, barrier: Barrier, inbox: Any, outbox: Any) -> None:
    try:
        while (job := inbox.get()) is not None:
            function, kwargs = job
            try:
                barrier.wait(timeout=TIMEOUT)
                result = function(**kwargs)
            except Exception as exc:  # reported to the parent, which fails the test
                result = ("crashed", f"{type(exc).__name__}: {exc}")
            outbox.put((index, result))
    finally:
        connections.close_all()


class Pool:
    """``size`` forked workers; ``run`` hands each one a job and releases them together.

    Forked after the test's setup: the workers see the settings the test changed (an
    adapter's URL, say) as they were at the fork."""

    def __init__(self, size: int) -> None:
        ctx = multiprocessing.get_context("fork")
        # The children must not share the parent's socket: each opens its own connection.
        connections.close_all()
        self.barrier = ctx.Barrier(size)
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.outbox = ctx.Queue()
        self.processes = [
            ctx.Process(target=_worker, args=(i, self.barrier, inbox, self.outbox), daemon=True)
            for i, inbox in enumerate(self.inboxes)
        ]
        for process in self.processes:
            process.start()

    def run(self, jobs: list[Job]) -> list[Any]:
        assert len(jobs) == len(self.inboxes)
        for inbox, job in zip(self.inboxes, jobs, strict=True):
            inbox.put(job)
        results = dict(self.outbox.get(timeout=TIMEOUT) for _ in jobs)
        return [results[i] for i in range(len(jobs))]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(timeout=TIMEOUT)
            assert process.exitcode == 0, f"worker exited with {process.exitcode}"
