"""Crash points at the phase boundaries of a delivery, for the tests that ``kill -9`` a
worker there. Inert unless ``RECONCILIATION_CRASH_AT`` names the point.

With ``RECONCILIATION_CRASH_AT=before_call`` (or ``after_call``, ``after_record``) and
``RECONCILIATION_CRASH_DIR`` set, the worker process SIGKILLs itself the first time each
command reaches that point (a marker file per command makes it once), exactly as an
outside ``kill -9`` at that instant would: no handler, no cleanup, no ack.
"""

from __future__ import annotations

import os
import signal

POINTS = ("before_call", "after_call", "after_record")


def crash_point(name: str, command_id: str) -> None:
    crash_once("RECONCILIATION", name, command_id)


def crash_once(prefix: str, name: str, key: str) -> None:
    """SIGKILL this process the first time ``key`` reaches point ``name``, if
    ``<prefix>_CRASH_AT`` names it and ``<prefix>_CRASH_DIR`` holds the marker files (the
    gateway's crash points use it with ``GATEWAY``)."""
    if os.environ.get(f"{prefix}_CRASH_AT") != name:
        return
    directory = os.environ.get(f"{prefix}_CRASH_DIR", "")
    if not directory:
        return
    try:
        fd = os.open(os.path.join(directory, f"{name}-{key}"), os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
