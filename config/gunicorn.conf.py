"""Gunicorn's configuration for the console: ``gunicorn -c config/gunicorn.conf.py config.wsgi``.

``bin/serve`` runs it so; everything here can be changed from the environment:

    HOST, PORT             where it listens (127.0.0.1:8000)
    WEB_CONCURRENCY        worker processes (default: 2 per core the process may use)
    GUNICORN_THREADS       threads per worker (default 4)
    GUNICORN_TIMEOUT       seconds a worker may stay silent before it is replaced (30)
    GUNICORN_GRACEFUL_TIMEOUT  seconds requests in flight get after SIGTERM (30)
    GUNICORN_KEEPALIVE     seconds an idle keep-alive connection stays open (5; set it above
                           the load balancer's idle timeout when one keeps connections)
    FORWARDED_ALLOW_IPS    proxies whose X-Forwarded-* headers are trusted (gunicorn's own)

Workers are ``gthread``: each process serves ``GUNICORN_THREADS`` requests at once and keeps
client connections alive, while the processes (not the threads, which share one GIL)
spread the Python work over the cores. A request holds at most one PostgreSQL connection,
kept between requests (``CONN_MAX_AGE``): plan for WEB_CONCURRENCY x GUNICORN_THREADS
connections per instance, plus the Celery workers', below PostgreSQL's ``max_connections``.

Metrics: every worker process counts on its own, so ``PROMETHEUS_MULTIPROC_DIR`` must name a
directory they share (``approvals.metrics``). ``bin/serve`` sets it and empties it at
start; run without it, this file makes a fresh temporary one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise SystemExit(f"gunicorn.conf.py: {name}={value!r} is not a whole number") from None
    if number < 1:
        raise SystemExit(f"gunicorn.conf.py: {name}={value!r} must be at least 1")
    return number


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


CORES = _cores()

wsgi_app = "config.wsgi:application"
bind = [f"{os.environ.get('HOST') or '127.0.0.1'}:{_int('PORT', 8000)}"]

worker_class = "gthread"
workers = _int("WEB_CONCURRENCY", 2 * CORES)
threads = _int("GUNICORN_THREADS", 4)

timeout = _int("GUNICORN_TIMEOUT", 30)
graceful_timeout = _int("GUNICORN_GRACEFUL_TIMEOUT", 30)
keepalive = _int("GUNICORN_KEEPALIVE", 5)

# Each worker loads the application itself: nothing (a database connection, a psycopg pool
# thread, a metrics file) is shared across a fork.
preload_app = False
# The workers' heartbeat files on tmpfs, so a slow disk never looks like a hung worker.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None  # noqa: S108
# No control socket: two instances on one host would otherwise share
# ~/.gunicorn/gunicorn.ctl; signals (TERM, HUP, TTIN/TTOU) manage the master.
control_socket_disable = True

# One line per request on stdout: who, what, status, bytes, milliseconds, the trace id the
# console answered with (also in its own log lines and audit events), the user agent.
accesslog = "-"
errorlog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(B)s %(M)sms trace=%({x-trace-id}o)s pid=%(p)s ua="%(a)s"'

_metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
_own_metrics_dir = not _metrics_dir
if _own_metrics_dir:
    _metrics_dir = tempfile.mkdtemp(prefix="console-metrics-")
    # Set before any worker imports prometheus_client: it chooses file-backed values then.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir


def child_exit(server: Any, worker: Any) -> None:
    """A worker ended: its counters stay counted; any live gauge of its pid goes."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid, _metrics_dir)


def on_exit(server: Any) -> None:
    if _own_metrics_dir:
        shutil.rmtree(_metrics_dir, ignore_errors=True)
