"""``GET /api/v1/occurrences/{id}?wait=N``: the long-poll.

Under ASGI (gunicorn's asgi worker serving config/asgi.py, as bin/serve runs it, against
the test database) a waiter holds no thread: it is woken by PostgreSQL's NOTIFY from the
deciding transaction. 500 waiters on one machine are each answered within a second of their
decision, with two reads each, while the server's threads and database connections stay
few. Under WSGI (Django's test client here) the view waits in its thread, reading at
intervals: the same answers.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from django.db import connection, connections
from django.db.models import Sum

from approvals.api.longpoll import LISTEN_APPLICATION_NAME, parse_wait
from approvals.models import Occurrence, RuntimeKeyUsage
from approvals.reviews.decisions import occurrence_reject
from tests.clients.conftest import run_async
from tests.conftest import Runtime, approve, make_runtime
from tests.serve.servers import (
    ASGI_APPLICATION_NAME,
    ServerProcess,
    asgi_server,
    sample,
    scrape,
    wait_for_sample,
)

__all__ = ["asgi_server"]  # a fixture

WAITING = "console_long_poll_waiting"  # the gauge of long-polls waiting for a change

POSTGRES_ONLY = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="LISTEN/NOTIFY and the ASGI server need PostgreSQL"
)


def reject(occurrence_id: str, reviewer: Any, reason: str = "Not this one.") -> None:
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason=reason
    )


def proposed(runtime: Runtime, ref: str) -> str:
    response = runtime.propose(client_ref=ref)
    assert response.status_code == 201, response.content
    occurrence_id: str = response.json()["occurrence_id"]
    return occurrence_id


# --- every answer is a state that existed ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
@POSTGRES_ONLY
def test_a_decision_committing_mid_read_is_not_half_seen(tenant: Any, reviewer: Any) -> None:
    """The occurrence and its approvals are read by several queries. A decision committed
    between them (here: forced, by another connection, right after the occurrence's row
    was read) must not give an answer with the old status beside the new approval: the
    read sees one moment, and the next read sees the decision whole. Before the read was
    one snapshot, this is how a long-poll woke with `pending_review` and an approval."""
    runtime = make_runtime(tenant, "snapshot-reader")
    occurrence_id = proposed(runtime, "snap")
    occurrence_table = f'FROM "{Occurrence._meta.db_table}"'
    decided: list[str] = []

    def approve_elsewhere() -> None:
        try:
            approve(occurrence_id, reviewer)
            decided.append("approved")
        finally:
            connections.close_all()

    def decide_after_the_occurrence_row(
        execute: Any, sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        result = execute(sql, params, many, context)
        if not decided and sql.lstrip().startswith("SELECT") and occurrence_table in sql:
            other = threading.Thread(target=approve_elsewhere)
            other.start()
            other.join(timeout=30)
            assert decided, "the approval in the other connection did not commit"
        return result

    with connection.execute_wrapper(decide_after_the_occurrence_row):
        during = runtime.get(f"/api/v1/occurrences/{occurrence_id}").json()
    assert decided == ["approved"]
    assert (during["status"], during["approval"]) == ("pending_review", None)
    after = runtime.get(f"/api/v1/occurrences/{occurrence_id}").json()
    assert (after["status"], after["approval"]["state"]) == ("approved", "issued")


@pytest.mark.django_db(transaction=True)
@POSTGRES_ONLY
def test_a_snapshot_is_one_read_only_transaction_and_leaves_the_connection_as_it_was() -> None:
    """The snapshot begins its transaction REPEATABLE READ READ ONLY (psycopg writes both
    into its BEGIN); after it, the connection writes again, at Django's isolation level."""
    from approvals.reviews.selectors import snapshot

    def transaction_settings() -> tuple[str, str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('transaction_isolation'), "
                "current_setting('transaction_read_only')"
            )
            isolation, read_only = cursor.fetchone()
        return isolation, read_only

    before = transaction_settings()
    with snapshot():
        assert transaction_settings() == ("repeatable read", "on")
    assert transaction_settings() == before == ("read committed", "off")


# --- WSGI: the view waits in its thread ------------------------------------------------------


@pytest.fixture
def quick_fallback(settings: Any) -> None:
    settings.LONG_POLL_FALLBACK_SECONDS = 0.05


@pytest.mark.usefixtures("quick_fallback")
def test_unchanged_state_is_answered_when_the_wait_is_over(runtime: Runtime) -> None:
    occurrence_id = proposed(runtime, "a")
    first = runtime.get(f"/api/v1/occurrences/{occurrence_id}")
    started = time.monotonic()
    waited = runtime.get(f"/api/v1/occurrences/{occurrence_id}?wait=1")
    assert time.monotonic() - started >= 1.0
    assert waited.status_code == 200
    assert waited["ETag"] == first["ETag"]
    assert waited.json()["status"] == "pending_review"
    # With the ETag it has, the client gets 304 when the wait ends with nothing new.
    again = runtime.get(
        f"/api/v1/occurrences/{occurrence_id}?wait=1", HTTP_IF_NONE_MATCH=first["ETag"]
    )
    assert again.status_code == 304
    assert again["ETag"] == first["ETag"]


@pytest.mark.usefixtures("quick_fallback")
def test_a_stale_if_none_match_is_answered_at_once(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = proposed(runtime, "b")
    before = runtime.get(f"/api/v1/occurrences/{occurrence_id}")["ETag"]
    reject(occurrence_id, reviewer)
    started = time.monotonic()
    answer = runtime.get(f"/api/v1/occurrences/{occurrence_id}?wait=30", HTTP_IF_NONE_MATCH=before)
    assert time.monotonic() - started < 5
    assert answer.status_code == 200
    assert answer.json()["status"] == "rejected"
    assert answer["ETag"] != before


# Digits other than ASCII's (fullwidth, Arabic-Indic, superscript), and what pydantic alone
# reads as a number but the ASGI long-poll does not (Unicode and ASCII spaces around it, an
# underscore, a sign): a waiter under ASGI would hold a thread for them.
NOT_ASCII_SECONDS = ["\uff11", "\u0663", "\u00b2", "1\u3000", "\u00a01", " 1", "1_0", "+1"]


@pytest.mark.parametrize("wait", ["abc", "-1", "61", "1.5", *NOT_ASCII_SECONDS])
def test_an_invalid_wait_is_a_422_with_the_envelope(runtime: Runtime, wait: str) -> None:
    occurrence_id = proposed(runtime, "c")
    response = runtime.get(f"/api/v1/occurrences/{occurrence_id}?{urlencode({'wait': wait})}")
    assert response.status_code == 422
    assert response.json()["error"]["code"]
    assert response.json()["error"]["details"][0]["field"] == "wait"


@pytest.mark.parametrize("wait", NOT_ASCII_SECONDS)
def test_the_long_poll_reads_ascii_digits_only(wait: str) -> None:
    assert parse_wait(wait) is None  # left to the view, which answers 422 at once
    assert parse_wait("7") == 7


def test_wait_zero_answers_at_once(runtime: Runtime) -> None:
    occurrence_id = proposed(runtime, "d")
    response = runtime.get(f"/api/v1/occurrences/{occurrence_id}?wait=0")
    assert response.status_code == 200
    assert response.json()["occurrence_id"] == occurrence_id


def test_another_tenants_occurrence_is_404_without_waiting(
    runtime: Runtime, other_runtime: Runtime
) -> None:
    occurrence_id = proposed(runtime, "e")
    started = time.monotonic()
    response = other_runtime.get(f"/api/v1/occurrences/{occurrence_id}?wait=30")
    assert time.monotonic() - started < 5
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quick_fallback")
def test_wsgi_wait_answers_with_the_decision(tenant: Any, reviewer: Any) -> None:
    runtime = make_runtime(tenant, "wsgi-waiter")
    occurrence_id = proposed(runtime, "f")
    timer = threading.Timer(0.5, approve, args=(occurrence_id, reviewer))
    timer.start()
    try:
        started = time.monotonic()
        answer = runtime.get(f"/api/v1/occurrences/{occurrence_id}?wait=30")
    finally:
        timer.join()
    assert time.monotonic() - started < 10
    assert answer.status_code == 200
    assert answer.json()["status"] == "approved"


# --- ASGI: gunicorn's asgi worker, woken by NOTIFY --------------------------------------------


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _server_connections() -> int:
    """The ASGI server's connections to the database: its pools' (named by the PGAPPNAME
    the fixture gives it) and its LISTEN connections. Not autovacuum's workers, which
    a burst of proposals wakes in the same database, nor any other client's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND application_name IN (%s, %s)",
            [ASGI_APPLICATION_NAME, LISTEN_APPLICATION_NAME],
        )
        (count,) = cursor.fetchone()
    return int(count)


@pytest.mark.django_db(transaction=True)
@POSTGRES_ONLY
def test_asgi_long_poll_semantics(asgi_server: ServerProcess, tenant: Any, reviewer: Any) -> None:
    runtime = make_runtime(tenant, "asgi-waiter")
    headers = {"Authorization": f"Bearer {runtime.raw_key}"}
    occurrence_id = proposed(runtime, "g")
    url = f"{asgi_server.url}/api/v1/occurrences/{occurrence_id}"
    with httpx.Client(headers=headers, timeout=60) as http:
        first = http.get(url)
        assert first.status_code == 200, (first.text, asgi_server.output()[-3000:])
        etag = first.headers["ETag"]
        # Nothing happens: the unchanged state when the wait is over, 304 with the ETag.
        started = time.monotonic()
        unchanged = http.get(url, params={"wait": 1})
        assert time.monotonic() - started >= 1.0
        assert unchanged.status_code == 200
        assert unchanged.headers["ETag"] == etag
        assert http.get(url, params={"wait": 1}, headers={"If-None-Match": etag}).status_code == 304
        # Errors are answered at once, in the envelope.
        assert (
            http.get(url, params={"wait": 30}, headers={"Authorization": "Bearer no"}).json()[
                "error"
            ]["code"]
            == "unauthenticated"
        )
        assert http.get(url, params={"wait": "x"}).status_code == 422
        # Refused, not waited on: a fullwidth 9 would otherwise hold the request 9 s (a
        # bound far from how long a refusal takes, on a loaded machine too).
        started = time.monotonic()
        assert http.get(url, params={"wait": "\uff19"}).status_code == 422  # fullwidth 9
        assert time.monotonic() - started < 9.0
        # A decision wakes the waiter as its transaction commits.
        timer = threading.Timer(0.5, reject, args=(occurrence_id, reviewer, "Wrong order."))
        timer.start()
        started = time.monotonic()
        woken = http.get(url, params={"wait": 30}, headers={"If-None-Match": etag})
        timer.join()
        # Long before the 30 s deadline (how soon, under load, is the crowd test's business).
        assert time.monotonic() - started < 0.5 + 15.0
        assert woken.status_code == 200
        assert woken.json()["status"] == "rejected"
        assert woken.json()["rejection_reason"] == "Wrong order."
        assert woken.headers["ETag"] != etag
    assert sample(scrape(asgi_server.url), WAITING) == 0
    # Seven requests with the key (the proposal, six reads), each counted once by the rate
    # limit, though the three long-polls read seven times between them.
    assert sample(scrape(asgi_server.url), "console_long_poll_reads_total") >= 7
    counted = RuntimeKeyUsage.objects.filter(runtime_key=runtime.key).aggregate(n=Sum("requests"))
    assert counted["n"] == 7


@pytest.mark.django_db(transaction=True)
@POSTGRES_ONLY
def test_a_client_that_leaves_stops_waiting(asgi_server: ServerProcess, tenant: Any) -> None:
    runtime = make_runtime(tenant, "asgi-leaver")
    occurrence_id = proposed(runtime, "h")
    url = f"{asgi_server.url}/api/v1/occurrences/{occurrence_id}?wait=60"
    headers = {"Authorization": f"Bearer {runtime.raw_key}"}

    async def leave() -> None:
        async with httpx.AsyncClient(headers=headers) as http:
            task = asyncio.ensure_future(http.get(url, timeout=90))
            await asyncio.sleep(0.3)
            task.cancel()

    run_async(leave())
    wait_for_sample(asgi_server.url, WAITING, lambda n: n == 0, timeout=10)


WAITERS = 500
DECISIONS_PER_SECOND = 25


def _crowd(url: str, key: str, ids: list[str], results: Any) -> None:
    """In a forked process: one long-poll per occurrence; puts {id: (time, status, state)}."""
    answered: dict[str, tuple[float, int, str]] = {}

    async def wait_all() -> None:
        limits = httpx.Limits(max_connections=len(ids) + 10, max_keepalive_connections=0)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(headers=headers, limits=limits, timeout=120) as http:

            async def one(occurrence_id: str) -> None:
                try:
                    response = await http.get(
                        f"{url}/api/v1/occurrences/{occurrence_id}", params={"wait": 60}
                    )
                except httpx.HTTPError as exc:
                    answered[occurrence_id] = (time.time(), 0, type(exc).__name__)
                    return
                ok = response.status_code == 200
                answered[occurrence_id] = (
                    time.time(),
                    response.status_code,
                    response.json().get("status", "") if ok else response.text[:200],
                )

            await asyncio.gather(*(one(i) for i in ids))

    asyncio.run(wait_all())
    results.put(answered)


@pytest.mark.django_db(transaction=True)
@POSTGRES_ONLY
def test_500_waiters_are_each_woken_within_a_second_of_their_decision(
    asgi_server: ServerProcess, tenant: Any, reviewer: Any
) -> None:
    runtime = make_runtime(tenant, "asgi-crowd")
    ids = [proposed(runtime, f"crowd-{i}") for i in range(WAITERS)]
    reads_before = sample(scrape(asgi_server.url), "console_long_poll_reads_total")
    # The waiters in a process of their own, so that the deciding loop below does not
    # share a GIL with them: the time each answer arrived is measured where it arrives.
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    connections.close_all()
    crowd = ctx.Process(target=_crowd, args=(asgi_server.url, runtime.raw_key, ids, results))
    crowd.start()
    try:
        wait_for_sample(asgi_server.url, WAITING, lambda n: n >= WAITERS, timeout=60)
        # While 500 wait, no thread and no database connection is held for each of them
        # (a WSGI server would hold 500 threads): a few per worker (the pool's, the
        # executors'), at most DB_POOL_MAX connections and one LISTEN per worker.
        threads = [_threads(pid) for pid in asgi_server.descendants()]
        assert threads and sum(threads) < WAITERS / 2, threads
        connected = _server_connections()
        assert 2 <= connected <= 2 * (10 + 1), connected
        started = time.monotonic()
        decided: dict[str, float] = {}
        for n, occurrence_id in enumerate(ids):
            # 25 decisions a second (90,000 an hour, far beyond a team of reviewers): at full
            # speed this process and the server's reads would saturate two cores, and the
            # test would measure that queue instead of the wake-up.
            pause = started + n / DECISIONS_PER_SECOND - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            reject(occurrence_id, reviewer, "Crowd control.")
            decided[occurrence_id] = time.time()
        answered: dict[str, tuple[float, int, str]] = results.get(timeout=120)
    finally:
        crowd.join(timeout=30)
        if crowd.is_alive():
            crowd.kill()
    assert len(answered) == WAITERS
    wrong = [i for i in ids if answered[i][1:] != (200, "rejected")]
    assert not wrong, [answered[i] for i in wrong[:10]]
    latencies = sorted(answered[i][0] - decided[i] for i in ids)
    late = [round(x, 3) for x in latencies if x > 1.0]
    assert not late, (
        f"{len(late)} of {WAITERS} waiters answered more than 1 s after their decision "
        f"(p50 {latencies[WAITERS // 2]:.3f} s, p95 {latencies[WAITERS * 95 // 100]:.3f} s): "
        f"{late[:20]}"
    )
    # Two reads per waiter: the first, and the one its decision woke.
    reads = sample(scrape(asgi_server.url), "console_long_poll_reads_total") - reads_before
    assert reads <= 2 * WAITERS + 10, reads


# The document describes the tool contracts, read from the database.
@pytest.mark.django_db
def test_the_wait_parameter_is_in_the_schema(client: Any) -> None:
    schema = client.get("/api/v1/openapi.json").json()
    parameters = schema["paths"]["/api/v1/occurrences/{occurrence_id}"]["get"]["parameters"]
    wait = next(p for p in parameters if p["name"] == "wait")
    assert wait["in"] == "query"
    assert wait["schema"]["maximum"] == 60
    assert re.search(r"long-poll", wait["schema"].get("description", "") + str(wait), re.I)
