"""The execution-id and client_ref conventions.

An **execution id** names one attempt at running one tool call. It must be

* **stable across re-deliveries of one attempt**: a runtime that picked up a token and
  crashed before claiming asks again with the same execution id and gets a fresh token
  (the console binds the approval to the first execution that picked it up; any other
  execution is refused). So derive it from durable facts (the run or thread, the tool-call
  id and the attempt number), never from a process id, a random value or the clock.
* **new for a new attempt**: when the runtime deliberately tries again after a settled
  failure (a new epoch, ``POST /occurrences/{id}/epochs``), it increments ``attempt``.

``client_ref`` names the tool call inside its run (frameworks reuse ids such as ``call_0``
across conversations, which is why the console scopes ``client_ref`` to ``run_id``).
"""

from __future__ import annotations

import hashlib

MAX_ID_LENGTH = 200


def _bounded(prefix: str, parts: tuple[str, ...]) -> str:
    readable = ":".join((prefix, *parts))
    if len(readable) <= MAX_ID_LENGTH and all(p.isprintable() for p in parts):
        return readable
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:40]
    return f"{prefix}:{digest}"


def execution_id_for(run_id: str, call_id: str, attempt: int = 1, *, prefix: str = "exec") -> str:
    """The execution id of ``attempt`` at the tool call ``call_id`` of run ``run_id``:
    the same inputs always give the same id (at most 200 characters)."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    return _bounded(prefix, (run_id, call_id, str(attempt)))


def client_ref_for(call_id: str, *, prefix: str = "call") -> str:
    """The ``client_ref`` of a tool call inside its run (at most 200 characters)."""
    return _bounded(prefix, (call_id,))
