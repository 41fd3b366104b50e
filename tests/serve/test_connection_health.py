"""A connection's health is told by its socket before any round trip
(``config/postgresql/health.py``): a connection the server closed (restart, stop, a
terminated backend) is found out and replaced before a request uses it, and a healthy one is
lent without a query. Against the real server: the backend is terminated with
``pg_terminate_backend``, as a restart terminates every backend."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from config.postgresql.base import DatabaseWrapper
from config.postgresql.health import looks_alive

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's connections"),
    pytest.mark.django_db,
]


def wrapper(alias: str, **pool: int) -> DatabaseWrapper:
    """A second connection to the test database, pooled as under ASGI or kept."""
    settings_dict = {**connection.settings_dict, "CONN_MAX_AGE": 0}
    settings_dict["OPTIONS"] = {**settings_dict.get("OPTIONS", {})}
    if pool:
        settings_dict["OPTIONS"]["pool"] = {"timeout": 10, **pool}
        settings_dict["CONN_HEALTH_CHECKS"] = False  # as config/settings.py sets it
    return DatabaseWrapper(settings_dict, alias=alias)


@pytest.fixture
def pooled() -> Iterator[DatabaseWrapper]:
    db = wrapper("health-test-pool", min_size=1, max_size=1)
    try:
        yield db
    finally:
        db.close()
        db.close_pool()  # type: ignore[attr-defined]  # Django 5.1+, not in django-stubs


def backend_pid(db: DatabaseWrapper) -> int:
    with db.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid: int = cursor.fetchone()[0]
    return pid


def terminate(pid: int) -> None:
    """Terminate the backend and wait until it is gone, as a restart would leave it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            # pg_stat_activity is read once per transaction unless its snapshot is cleared.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone()[0] == 0:
                return
            time.sleep(0.05)
    pytest.fail(f"backend {pid} still there")


def test_a_pooled_connection_the_server_closed_is_replaced_before_use(
    pooled: DatabaseWrapper,
) -> None:
    dead = backend_pid(pooled)
    pooled.close()  # back to the pool, its only connection
    terminate(dead)

    # The request's first statement runs on a live connection: no error, another backend.
    assert backend_pid(pooled) != dead


def test_a_healthy_pooled_connection_is_lent_without_a_query(
    pooled: DatabaseWrapper, tmp_path: Path
) -> None:
    first = backend_pid(pooled)
    raw: Any = pooled.connection
    trace = tmp_path / "trace"
    with trace.open("w") as out:
        # libpq's trace of every message on this connection, through the pool and back.
        raw.pgconn.trace(out.fileno())
        try:
            pooled.close()  # back to the pool
            assert backend_pid(pooled) == first  # borrowed again, as by the next request
        finally:
            raw.pgconn.untrace()
    sent = [line for line in trace.read_text().splitlines() if "\tF\t" in line]
    # What the client sent (F: frontend): the statement above, no check before it.
    queries = [line for line in sent if "\tQuery\t" in line or "\tParse\t" in line]
    assert len(queries) == 1 and "pg_backend_pid" in queries[0], sent


def test_a_kept_connection_the_server_closed_is_not_usable() -> None:
    kept = wrapper("health-test-kept")
    try:
        pid = backend_pid(kept)
        assert looks_alive(kept.connection)
        assert kept.is_usable()

        terminate(pid)

        assert not looks_alive(kept.connection)
        assert not kept.is_usable()
    finally:
        kept.close()
