"""Crash points between a gated call's steps, for the tests that ``kill -9`` the gateway
there. Inert unless ``GATEWAY_CRASH_AT`` names the point and ``GATEWAY_CRASH_DIR`` is set.

``before_claim`` (approved, not claimed), ``after_claim`` (claimed, the upstream not
called, not marked ``calling``) and ``after_call`` (the upstream answered, the effect not reported):
the process SIGKILLs itself the first time a call reaches the point (a marker file per call
makes it once), as an outside ``kill -9`` at that instant would: the worker's mechanism,
``reconciliation.faults.crash_once``.
"""

from __future__ import annotations

from reconciliation.faults import crash_once

POINTS = ("before_claim", "after_claim", "after_call")


def crash_point(name: str, call_id: str) -> None:
    crash_once("GATEWAY", name, call_id)
