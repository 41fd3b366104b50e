"""The console's WSGI application with one request path profiled, for ``http_bench --profile``.

    gunicorn -c config/gunicorn.conf.py bench.profiled_wsgi:application

Requests whose path matches ``PROFILE_PATH`` (a regular expression matched at the path's
start, ``/api/v1/claims``: a plain path is a prefix), and whose method is
``PROFILE_METHOD`` if that is set, run under cProfile (after ``PROFILE_SKIP`` of them),
and every SQL statement they send is timed (``connection.execute_wrapper``), labelled by
its verb and table. After ``PROFILE_REQUESTS`` such requests the worker writes the profile
to ``PROFILE_OUT`` (pstats) and the statement times to ``PROFILE_OUT.sql.json``. Run it
with one worker and one thread: cProfile sees the thread that enabled it only.
"""

from __future__ import annotations

import cProfile
import json
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connection

from config.wsgi import application as _console

PATH = re.compile(os.environ.get("PROFILE_PATH", "/api/v1/claims"))
METHOD = os.environ.get("PROFILE_METHOD", "")  # only this method, if set
SKIP = int(os.environ.get("PROFILE_SKIP", "0") or 0)  # warm-up requests, not profiled
WANTED = int(os.environ.get("PROFILE_REQUESTS", "0") or 0)
OUT = os.environ.get("PROFILE_OUT", "")

_profiler = cProfile.Profile()
_lock = threading.Lock()
_done = 0
_skipped = 0
_wall = 0.0
# label -> [statements, seconds]
_sql: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
_TABLE = r"\s+\"?([A-Za-z_][A-Za-z0-9_]*)"
_LABELS = [
    re.compile(r"^\s*(UPDATE)" + _TABLE, re.IGNORECASE),
    re.compile(r"^\s*(INSERT\s+INTO)" + _TABLE, re.IGNORECASE),
    re.compile(r"^\s*(DELETE\s+FROM)" + _TABLE, re.IGNORECASE),
    re.compile(r"^\s*(SELECT)\b.*?\bFROM" + _TABLE, re.IGNORECASE | re.DOTALL),
]


def _label(sql: str) -> str:
    """``UPDATE approvals_approval``: the verb and the table written to (or read first)."""
    for pattern in _LABELS:
        found = pattern.match(sql)
        if found:
            return f"{' '.join(found.group(1).upper().split())} {found.group(2)}"
    words = sql.split(None, 1)
    return words[0].upper() if words else "?"


def _timed(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    started = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        entry = _sql[_label(sql)]
        entry[0] += 1
        entry[1] += time.perf_counter() - started


def _dump() -> None:
    _profiler.dump_stats(OUT)
    with open(OUT + ".sql.json", "w") as out:
        json.dump({"requests": _done, "wall": _wall, "sql": _sql}, out)


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    global _done, _skipped, _wall
    wanted = PATH.match(environ.get("PATH_INFO", "")) is not None and (
        not METHOD or environ.get("REQUEST_METHOD") == METHOD
    )
    if not wanted or (WANTED and _done >= WANTED):
        return _console(environ, start_response)
    if _skipped < SKIP:
        _skipped += 1
        return _console(environ, start_response)
    with _lock:  # one profiled request at a time (run with one thread anyway)
        started = time.perf_counter()
        _profiler.enable()
        try:
            with connection.execute_wrapper(_timed):
                response = _console(environ, start_response)
                body = list(response)
                close = getattr(response, "close", None)
                if close is not None:
                    close()  # request_finished: what gunicorn would call after sending
        finally:
            _profiler.disable()
            _wall += time.perf_counter() - started
            _done += 1
            if OUT and _done == WANTED:
                _dump()
    return body
