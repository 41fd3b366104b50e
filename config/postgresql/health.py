"""A connection's health, told without a round trip when it can be.

Django checks a kept connection before a request uses it (``CONN_HEALTH_CHECKS``: a
``SELECT 1``), and its pool checks each connection it lends (psycopg_pool's
``check_connection``: an empty query). Either is a round trip to PostgreSQL on every
request, which on the cheapest API call costs more than its one real read under load.

A connection that PostgreSQL closed, because the server was restarted or stopped or the
backend was terminated, tells on itself without one: the server sends its ``FATAL`` and
closes the socket, which makes the socket readable. An idle connection that is well has
nothing to read (every answer was read with its query). So ``looks_alive`` polls the socket
(no wait): nothing to read, the connection is taken as it is; something to read (the
closure, or a stray notice), the full check runs as before. What neither the poll nor the
empty query can tell apart quickly (a peer gone without closing its socket) stays as it was:
the request's first statement waits on TCP, and fails into the 503 either way.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool


def looks_alive(conn: psycopg.Connection[Any]) -> bool:
    """False if the connection is closed or broken or has something from the server
    waiting (likely its closure); True if it is idle with nothing to read."""
    if conn.closed or conn.broken:
        return False
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def healthy(conn: psycopg.Connection[Any]) -> bool:
    """``looks_alive``, else the pool's own check (a round trip) decides."""
    if looks_alive(conn):
        return True
    try:
        ConnectionPool.check_connection(conn)
    except psycopg.Error:
        return False
    return True
