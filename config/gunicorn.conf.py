"""Gunicorn's configuration for the console: ``gunicorn -c config/gunicorn.conf.py``.

``bin/serve`` runs it so; everything here can be changed from the environment:

    HOST, PORT             where it listens (127.0.0.1:8000)
    GUNICORN_WORKER_CLASS  asgi (default) or gthread, below
    WEB_CONCURRENCY        worker processes (default: 2 per core the process may use)
    GUNICORN_THREADS       threads per gthread worker (default 4)
    GUNICORN_TIMEOUT       seconds a worker may stay silent before it is replaced (30)
    GUNICORN_GRACEFUL_TIMEOUT  seconds requests in flight get after SIGTERM (30)
    GUNICORN_KEEPALIVE     seconds an idle keep-alive connection stays open (5; set it above
                           the load balancer's idle timeout when one keeps connections)
    FORWARDED_ALLOW_IPS    proxies whose X-Forwarded-* headers are trusted (gunicorn's own)

Workers are ``asgi``: gunicorn's own asyncio worker serving ``config.asgi``. A long-poll
(``GET /api/v1/occurrences/{id}?wait=N``) waits on the worker's event loop, holding no
thread and no database connection (``approvals.api.longpoll``); every other request runs in a
thread of its own as Django does under ASGI, and borrows a PostgreSQL connection from the
process's pool (``DB_POOL_MAX``, 10) for as long as it runs: plan for WEB_CONCURRENCY x
(DB_POOL_MAX + 1 LISTEN) connections per instance, plus the Celery workers', below
PostgreSQL's ``max_connections``. The processes (not the threads, which share one GIL)
spread the Python work over the cores. ``gthread`` serves ``config.wsgi`` on
``GUNICORN_THREADS`` threads per process with persistent connections (``CONN_MAX_AGE``),
a little cheaper per request, but each long-poll then holds a thread for its whole wait.
docs/deploy.md ("Serving it") has the measurement.

Metrics: every worker process counts on its own, so ``PROMETHEUS_MULTIPROC_DIR`` must name a
directory they share (``approvals.metrics``). ``bin/serve`` sets it and empties it at
start; run without it, this file makes a fresh temporary one.
"""

from __future__ import annotations

import ipaddress
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

# asgi (the default): gunicorn's own asyncio worker serving config.asgi, where a long-poll
# (GET /api/v1/occurrences/{id}?wait=N) waits on the event loop and holds no thread; the
# rest of Django runs as under WSGI, each request in a thread of its own. gthread: the
# WSGI application on threads, where each long-poll holds one of GUNICORN_THREADS.
# docs/deploy.md ("Serving it") has the measurement that chose asgi.
WORKER_CLASSES = {"asgi": "config.asgi:application", "gthread": "config.wsgi:application"}
worker_class = os.environ.get("GUNICORN_WORKER_CLASS", "").strip() or "asgi"
if worker_class not in WORKER_CLASSES:
    raise SystemExit(
        f"gunicorn.conf.py: GUNICORN_WORKER_CLASS={worker_class!r} is not one of "
        + ", ".join(sorted(WORKER_CLASSES))
    )
wsgi_app = WORKER_CLASSES[worker_class]
bind = [f"{os.environ.get('HOST') or '127.0.0.1'}:{_int('PORT', 8000)}"]

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


def _debug_on() -> bool:
    # As config/settings.py reads it; a value it cannot read stops the workers there.
    return os.environ.get("DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def _loopback(address: str) -> bool:
    """Whether a gunicorn bind address ("host:port", "[::1]:port", "unix:path",
    "fd://n") is reachable from this machine only."""
    if address.startswith("unix:"):
        return True
    if address.startswith("fd://"):
        return False  # a socket handed over: where it listens is unknown here
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or "]" in address else address
    host = host.removeprefix("[").removesuffix("]").strip().lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def on_starting(server: Any) -> None:
    """Refuse DEBUG on any address but the loopback, before anything listens: DEBUG serves
    a development key published in config/settings.py and full tracebacks. Checked here,
    on the addresses gunicorn will bind (HOST, or -b on its command line) and the
    environment it will give the workers (-e included)."""
    if not _debug_on():
        return
    public = [address for address in server.cfg.bind if not _loopback(address)]
    if public:
        raise SystemExit(
            f"gunicorn.conf.py: refusing to serve DEBUG=1 on {', '.join(public)}: DEBUG "
            "serves a public development key and full tracebacks, on 127.0.0.1, ::1 or "
            "localhost only. Unset DEBUG (and set SECRET_KEY) to serve anywhere else."
        )


def post_worker_init(worker: Any) -> None:
    """The worker has loaded the application: take its long-lived heap out of the garbage
    collector's full runs (config/heap.py), which otherwise walk it many times a minute."""
    from config.heap import freeze_startup_heap

    frozen = freeze_startup_heap()
    worker.log.info("froze %d startup objects out of the garbage collector's way", frozen)


def child_exit(server: Any, worker: Any) -> None:
    """A worker ended: its counters stay counted; any live gauge of its pid goes."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid, _metrics_dir)


def on_exit(server: Any) -> None:
    if _own_metrics_dir:
        shutil.rmtree(_metrics_dir, ignore_errors=True)
