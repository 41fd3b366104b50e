"""Publishing a task from a web request: through a pool of broker connections kept per
process and per broker URL.

A connection per publish cost a claim about 10 ms of CPU and up to 30 ms of wall time
(``bench/http_bench.py --profile``). The pool is keyed by the process id, so a forked child
(a gunicorn worker, a test's racing process) opens its own connections and never writes to
its parent's socket, and by the broker URL, so a changed configuration gets connections of
its own.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from celery import Task

_pools: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()
# At most this many connections per process; a publish waits for a free one.
POOL_LIMIT = 10


def _pool(task: Task) -> Any:  # type: ignore[type-arg]
    app = task.app
    url = str(app.conf.broker_write_url or app.conf.broker_url)
    key = (os.getpid(), url)
    pool = _pools.get(key)
    if pool is None:
        with _lock:
            pool = _pools.get(key)
            if pool is None:
                pool = app.connection_for_write(url).Pool(limit=POOL_LIMIT)
                _pools[key] = pool
    return pool


def publish(task: Task, args: tuple[Any, ...], *, countdown: float | None = None) -> None:  # type: ignore[type-arg]
    """Send ``task`` with ``args``; raises what the broker raises after two retries."""
    with _pool(task).acquire(block=True, timeout=5) as connection:
        task.apply_async(  # type: ignore[call-arg]
            args=args,
            countdown=countdown,  # type: ignore[arg-type]
            connection=connection,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2},
        )
