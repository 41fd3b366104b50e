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
across conversations, which is why the console scopes ``client_ref`` to ``run_id``). Models
reuse them inside one conversation too (``call_0`` in a later turn for another action), so
the adapters add the digest of the action the model proposed: the same call again is the
same request, another action under a reused id is a new one (not ``409
client_ref_conflict``). The execution id carries the same digest, so the two never share an
execution.
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


def _call(call_id: str, action_digest: str | None) -> tuple[str, ...]:
    if action_digest is None:
        return (call_id,)
    return (call_id, action_digest.rsplit(":", 1)[-1][:DIGEST_CHARS])


DIGEST_CHARS = 16


def execution_id_for(
    run_id: str,
    call_id: str,
    attempt: int = 1,
    *,
    prefix: str = "exec",
    action_digest: str | None = None,
) -> str:
    """The execution id of ``attempt`` at the tool call ``call_id`` of run ``run_id`` (with
    ``action_digest``: of that action under that call id): the same inputs always give the
    same id (at most 200 characters)."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    return _bounded(prefix, (run_id, *_call(call_id, action_digest), str(attempt)))


def client_ref_for(call_id: str, *, prefix: str = "call", action_digest: str | None = None) -> str:
    """The ``client_ref`` of a tool call inside its run, with ``action_digest`` (the digest
    of the action the model proposed) of that action under that call id (at most 200
    characters)."""
    return _bounded(prefix, _call(call_id, action_digest))
