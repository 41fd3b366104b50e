"""What load balancers and Prometheus ask: ``/healthz``, ``/readyz`` and ``/metrics``.

None of them signs anyone in or reads a session, so they set no cookie and write nothing.

- ``/healthz``: the process answers. No database, no broker: a load balancer that restarts
  an instance on a failed liveness check must not restart every instance when PostgreSQL
  is down.
- ``/readyz``: this instance can do its work: the database answers, the broker accepts a
  connection, and every migration this code knows is applied (an instance of a newer
  release waits until ``migrate`` ran). 200 or 503 with each check's result.
- ``/metrics``: Prometheus text for a scraper that sends ``Authorization: Bearer
  $METRICS_TOKEN``; 401 without it or with another one, and 404 when ``METRICS_TOKEN`` is
  unset (metrics off).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from approvals import metrics
from approvals.errors import ErrorCode
from config.celery import app as celery_app

# Seconds each dependency gets to answer before the instance is reported not ready.
CHECK_TIMEOUT = 2

# Applied migrations stay applied: once the check passed, this process does not load the
# migration graph again for this long (loading it reads every migration module).
MIGRATIONS_RECHECK_SECONDS = 60.0
_migrations_ok_until = 0.0


def _check_database() -> None:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _check_broker() -> None:
    options = {"socket_connect_timeout": CHECK_TIMEOUT, "socket_timeout": CHECK_TIMEOUT}
    with celery_app.connection_for_write(
        connect_timeout=CHECK_TIMEOUT, transport_options=options
    ) as conn:
        # No retry: the next probe is the retry.
        conn.ensure_connection(max_retries=0, timeout=CHECK_TIMEOUT)


def _check_migrations() -> None:
    global _migrations_ok_until
    if time.monotonic() < _migrations_ok_until:
        return
    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
        raise RuntimeError(f"{len(plan)} migration(s) not applied: {names}")
    _migrations_ok_until = time.monotonic() + MIGRATIONS_RECHECK_SECONDS


CHECKS: dict[str, Callable[[], None]] = {
    "database": _check_database,
    "broker": _check_broker,
    "migrations": _check_migrations,
}


def _json(body: dict[str, Any], status: int) -> HttpResponse:
    return JsonResponse(body, status=status)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    return _json({"status": "ok"}, 200)


@never_cache
@require_GET
def readyz(request: HttpRequest) -> HttpResponse:
    results: dict[str, str] = {}
    for name, check in CHECKS.items():
        if name == "migrations" and results.get("database") != "ok":
            results[name] = "skipped: no database"
            continue
        try:
            check()
        except Exception as exc:  # any failure means "not ready", with what it was
            # (A broken database connection is closed when the request finishes.)
            results[name] = f"failed: {type(exc).__name__}: {exc}"[:300]
        else:
            results[name] = "ok"
    ready = all(result == "ok" for result in results.values())
    return _json(
        {"status": "ready" if ready else "not_ready", "checks": results}, 200 if ready else 503
    )


def _bearer(request: HttpRequest) -> str:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    token: str = getattr(settings, "METRICS_TOKEN", "") or ""
    if not token:
        return _json({"error": {"code": ErrorCode.NOT_FOUND, "message": "Metrics are off."}}, 404)
    if not hmac.compare_digest(_bearer(request).encode(), token.encode()):
        response = _json(
            {"error": {"code": ErrorCode.UNAUTHORIZED, "message": "Bearer token required."}}, 401
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)
