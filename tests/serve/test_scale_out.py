"""Scale out on what exists: two gunicorn instances (config/gunicorn.conf.py, two worker
processes each) on different ports and two Celery workers, one PostgreSQL (the test
database) and one Redis, all real processes on the loopback, with the real sandbox as the
payments API.

Racing claims spread over both instances (forked processes released by a barrier, half of
them sending to each instance) still give exactly one ``approved`` per approval, and every
command is executed exactly once: one refund and one adapter call per idempotency key. The
instances' metrics add up to what happened.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection, connections

from approvals.models import Command
from reconciliation.models import AdapterInvocation
from tests.conftest import REFUND_ARGS, Runtime, approve
from tests.demo.sandbox_fixture import SandboxProcess, start_sandbox
from tests.reconciliation import worker_fixture
from tests.reconciliation.worker_fixture import Broker, Workers
from tests.serve.servers import ServerProcess, gunicorn, production_env, sample, scrape

pytestmark = [
    pytest.mark.race,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="scale-out runs on PostgreSQL and Redis"
    ),
]

broker = worker_fixture.broker
workers = worker_fixture.workers

ROUNDS = 12
RACERS = 8
TIMEOUT = 60.0
EXECUTED_WITHIN = 90.0


# --- racers: forked processes that only speak HTTP ------------------------------------------


def _racer(index: int, barrier: Barrier, inbox: Any, outbox: Any) -> None:
    # Its own HTTP client, made after the fork; no database connection at all.
    with httpx.Client(timeout=TIMEOUT) as http:
        while (job := inbox.get()) is not None:
            url, key, body = job
            try:
                barrier.wait(timeout=TIMEOUT)
                response = http.post(
                    f"{url}/api/v1/claims", json=body, headers={"Authorization": f"Bearer {key}"}
                )
                answer = response.json()
                result = (response.status_code, answer.get("decision"), answer.get("command_id"))
            except Exception as exc:  # reported to the parent, which fails the test
                result = (0, f"crashed: {type(exc).__name__}: {exc}", None)
            outbox.put((index, url, result))


class Racers:
    def __init__(self, size: int) -> None:
        ctx = multiprocessing.get_context("fork")
        connections.close_all()  # no socket of this process's shared with the children
        self.barrier = ctx.Barrier(size)
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.outbox = ctx.Queue()
        self.processes = [
            ctx.Process(target=_racer, args=(i, self.barrier, q, self.outbox), daemon=True)
            for i, q in enumerate(self.inboxes)
        ]
        for process in self.processes:
            process.start()

    def run(self, jobs: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, Any]]:
        for inbox, job in zip(self.inboxes, jobs, strict=True):
            inbox.put(job)
        answers = sorted(self.outbox.get(timeout=TIMEOUT * 2) for _ in jobs)
        return [(url, result) for _, url, result in answers]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(timeout=TIMEOUT)
            if process.is_alive():
                process.kill()


# --- the deployment -------------------------------------------------------------------------


@dataclass
class Deployment:
    instances: list[ServerProcess]
    sandbox: SandboxProcess


@pytest.fixture
def deployment(broker: Broker, workers: Workers, tmp_path: Path) -> Iterator[Deployment]:
    """Set up after ``workers``, so torn down first: the web instances stop (and drop their
    connections) before the workers' fixture waits for the test database to be free."""
    with start_sandbox(tmp_path / "sandbox") as sandbox:
        workers.start(sandbox, concurrency=2)
        workers.start(sandbox, concurrency=2)
        env = production_env(
            broker_url=broker.url,
            static_root=tmp_path / "no-collectstatic",
            WEB_CONCURRENCY=2,
            GUNICORN_THREADS=4,
        )
        instances = [gunicorn(name, env, tmp_path) for name in ("web-a", "web-b")]
        try:
            for instance in instances:
                instance.start(ready_path="/readyz")
            yield Deployment(instances, sandbox)
        finally:
            for instance in instances:
                instance.stop()


@pytest.fixture
def racers(deployment: Deployment) -> Iterator[Racers]:
    pool = Racers(RACERS)
    try:
        yield pool
    finally:
        pool.close()


def _approved_token(http: httpx.Client, a: str, b: str, runtime: Runtime, reviewer: Any) -> str:
    """Proposed through instance a, approved by a reviewer, picked up through instance b."""
    auth = {"Authorization": f"Bearer {runtime.raw_key}"}
    proposed = http.post(
        f"{a}/api/v1/occurrences",
        headers=auth,
        json={
            "tool": "issue_refund",
            "run_id": "run-scale-out",
            "reason": "two instances",
            "client_ref": uuid.uuid4().hex,
            "arguments": REFUND_ARGS,
        },
    )
    assert proposed.status_code == 201, proposed.text
    occurrence_id = proposed.json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    picked = http.post(f"{b}/api/v1/occurrences/{occurrence_id}/token", headers=auth)
    assert picked.status_code == 200, picked.text
    token: str = picked.json()["token"]
    return token


def test_racing_claims_over_two_instances_give_one_approval_and_one_execution(
    deployment: Deployment, racers: Racers, runtime: Runtime, reviewer: Any
) -> None:
    a, b = (instance.url for instance in deployment.instances)
    served: Counter[str] = Counter()
    winners = []
    with httpx.Client(timeout=TIMEOUT) as http:
        for round_no in range(ROUNDS):
            token = _approved_token(http, a, b, runtime, reviewer)
            jobs = [
                (
                    a if i % 2 == 0 else b,
                    runtime.raw_key,
                    {
                        "token": token,
                        "execution_id": f"exec-{round_no}-{i}",
                        "action": {"tool": "issue_refund", "arguments": REFUND_ARGS},
                    },
                )
                for i in range(RACERS)
            ]
            results = racers.run(jobs)
            outcomes = Counter((status, decision) for _, (status, decision, _) in results)
            assert outcomes == {(200, "approved"): 1, (403, "replayed"): RACERS - 1}, results
            winners.append(next(cid for _, (_, d, cid) in results if d == "approved"))
            served.update(url for url, _ in results)
    assert served == {a: ROUNDS * RACERS // 2, b: ROUNDS * RACERS // 2}
    assert len(set(winners)) == ROUNDS

    # Every command executed once, by whichever worker took it.
    deadline = time.monotonic() + EXECUTED_WITHIN
    while time.monotonic() < deadline:
        states = Counter(Command.objects.values_list("state", flat=True))
        if states == {Command.State.COMMITTED: ROUNDS}:
            break
        time.sleep(0.25)
    assert states == {Command.State.COMMITTED: ROUNDS}, states
    commands = {str(c.pk): c.idempotency_key for c in Command.objects.all()}
    assert set(commands) == set(winners)
    posts = [
        r["idempotency_key"]
        for r in deployment.sandbox.requests()
        if r["method"] == "POST" and r["path"] == "/v1/refunds"
    ]
    assert sorted(posts) == sorted(commands.values())
    assert len(deployment.sandbox.refunds()) == ROUNDS
    invocations = Counter(AdapterInvocation.objects.values_list("command_id", flat=True))
    assert sorted(map(str, invocations)) == sorted(commands) and set(invocations.values()) == {1}

    # Each instance counted the claims it decided; together, what happened.
    scraped = [scrape(url) for url in (a, b)]
    approved = [
        sample(s, "console_claims_total", decision="approved", reason="claimed") for s in scraped
    ]
    replayed = [
        sample(s, "console_claims_total", decision="replayed", reason="consumed_by_other_execution")
        for s in scraped
    ]
    assert sum(approved) == ROUNDS
    assert sum(replayed) == ROUNDS * (RACERS - 1)
    assert all(approved[i] + replayed[i] == ROUNDS * RACERS // 2 for i in range(2))
    proposals = [
        sample(s, "console_proposals_total", tool="issue_refund", status="pending_review")
        for s in scraped
    ]
    assert proposals == [ROUNDS, 0]
    for s in scraped:
        assert sample(s, "console_effects", state="committed") == ROUNDS
        assert sample(s, "console_pending_reviews") == 0
