"""Crash points between a gated call's steps, for the tests that ``kill -9`` the gateway
there. Inert unless ``GATEWAY_CRASH_AT`` names the point and ``GATEWAY_CRASH_DIR`` is set.

``before_claim`` (approved, not claimed), ``after_claim`` (claimed, the upstream not
called, not marked ``calling``) and ``after_call`` (the upstream answered, the effect not reported):
the process SIGKILLs itself the first time a call reaches the point (a marker file per call
makes it once), as an outside ``kill -9`` at that instant would.
"""

from __future__ import annotations

import os
import signal

POINTS = ("before_claim", "after_claim", "after_call")


def crash_point(name: str, call_id: str) -> None:
    if os.environ.get("GATEWAY_CRASH_AT") != name:
        return
    directory = os.environ.get("GATEWAY_CRASH_DIR", "")
    if not directory:
        return
    try:
        fd = os.open(os.path.join(directory, f"{name}-{call_id}"), os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
