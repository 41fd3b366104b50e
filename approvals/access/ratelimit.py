"""Rate limits and refusal accounting per runtime key.

Every API request a runtime key makes is counted in a fixed window of
``API_RATE_WINDOW_SECONDS`` (60 s) by one atomic upsert of the key's counter row
(``RuntimeKeyUsage``: ``INSERT … ON CONFLICT DO UPDATE … RETURNING``). Beyond the tenant's
limit (``Tenant.api_rate_limit``, else ``API_RATE_LIMIT``) the API answers ``429
rate_limited`` with ``Retry-After`` until the window ends, and writes nothing else.

The counter has to be one counter for every web process. ``LocMemCache`` is per process
(four gunicorn workers would allow four times the limit) and ``DatabaseCache.incr`` is a
read and a write (concurrent requests lose counts). The upsert is atomic across processes
on PostgreSQL (and on SQLite, which has one writer), costs one statement per request, and
leaves at most a few rows per active key: a window's row is deleted when it is reported.

With Redis (``API_RATE_LIMIT_REDIS_URL``, by default the Celery broker's when it is Redis)
the requests are counted there instead (``approvals.access.ratecounter``: an atomic
``INCR`` with the window's expiry), and a request within its limit writes nothing to the
database. The row is written only for what must be reported: a request over the limit
(the row keeps the highest count Redis gave) and an unknown token's refusal. Everything
else reads as above: the same 429, the same ``Retry-After``, the same burst event, whose
``requests`` is Redis's count of the window while Redis still has it. When Redis does not
answer, requests are counted in the database as above until it does, so during an outage
a window's requests are split between the two counters (the limit holds for each).

Refused claims with a token the tenant never issued (``unknown_token``) are counted in the
same row. The first ``API_AUDITED_REFUSALS_PER_WINDOW`` (20) per key and window are audited
one by one, as before; the rest are only counted. When a window has ended, its row is
deleted and, if it held anything not audited one by one (requests answered 429, unknown
tokens beyond the first 20), ONE ``security.refusals_burst`` audit event reports the counts.
That happens at the key's first request in a later window, or in the Celery beat task
``usage_report_closed`` (once a window) for a key that went quiet. The DELETE … RETURNING
and the audit event share a transaction, so a window is reported exactly once.

Reviewers' access tokens (``approvals.access.reviewer_tokens``) are held to the same limit
per token, counted the same way in their own rows (``ReviewerTokenUsage``); a window in
which a token went over it is reported by the same ``security.refusals_burst`` event,
naming the token and its owner.

Refusals that name a real approval (``replayed``, ``scope_mismatch``, ``expired``,
``revoked``) and duplicate deliveries are never budgeted: they are the evidence that tells a
replay from a redelivery, and a runtime could otherwise spend the budget on bogus tokens to
hide a replay. The rate limit bounds them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from celery import shared_task
from django.conf import settings
from django.db import connection, transaction

from approvals.access import ratecounter
from approvals.access.reviewer_tokens import via
from approvals.audit.record import audit_record
from approvals.models import ReviewerToken, ReviewerTokenUsage, RuntimeKey, RuntimeKeyUsage, Tenant
from approvals.vocabulary import AuditKind, EventReason

BURST_EVENT = AuditKind.SECURITY_REFUSALS_BURST


def now() -> float:
    """The clock windows are cut from (Unix seconds). Tests replace it."""
    return time.time()


@dataclass(frozen=True)
class Window:
    start: int
    seconds: int

    @property
    def end(self) -> int:
        return self.start + self.seconds

    def retry_after(self, at: float) -> int:
        """Whole seconds until the window ends, at least 1."""
        return max(1, math.ceil(self.end - at))


def current_window(at: float | None = None) -> Window:
    seconds = int(settings.API_RATE_WINDOW_SECONDS)
    moment = now() if at is None else at
    return Window(start=int(moment // seconds) * seconds, seconds=seconds)


def request_limit(key: RuntimeKey | ReviewerToken) -> int:
    """Requests per window for this key or token: its tenant's limit, or the setting's."""
    tenant: Tenant = key.tenant
    limit = tenant.api_rate_limit
    return int(limit if limit else settings.API_RATE_LIMIT)


def audited_refusals_per_window() -> int:
    return int(settings.API_AUDITED_REFUSALS_PER_WINDOW)


# --- the counters -------------------------------------------------------------------------

_UPSERT = """
    INSERT INTO {usage} AS u (runtime_key_id, window_start, window_seconds, request_limit,
                              requests, unknown_token_refusals)
    VALUES (%s, %s, %s, %s, %s, %s)
    ON CONFLICT (runtime_key_id, window_start) DO UPDATE
       SET requests = u.requests + EXCLUDED.requests,
           unknown_token_refusals = u.unknown_token_refusals + EXCLUDED.unknown_token_refusals,
           request_limit = EXCLUDED.request_limit
    RETURNING requests, unknown_token_refusals
"""


def _upsert(key: RuntimeKey, window: Window, *, requests: int, refusals: int) -> tuple[int, int]:
    sql = _UPSERT.format(usage=RuntimeKeyUsage._meta.db_table)
    params = (key.pk, window.start, window.seconds, request_limit(key), requests, refusals)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return int(row[0]), int(row[1])


class Admission(NamedTuple):
    allowed: bool
    requests: int
    limit: int
    retry_after: int


# With Redis counting: the row keeps the highest count Redis gave (requests arrive in any
# order), and the refusals add up as above.
_UPSERT_SEEN = """
    INSERT INTO {usage} AS u (runtime_key_id, window_start, window_seconds, request_limit,
                              requests, unknown_token_refusals)
    VALUES (%s, %s, %s, %s, %s, %s)
    ON CONFLICT (runtime_key_id, window_start) DO UPDATE
       SET requests = CASE WHEN EXCLUDED.requests > u.requests
                           THEN EXCLUDED.requests ELSE u.requests END,
           unknown_token_refusals = u.unknown_token_refusals + EXCLUDED.unknown_token_refusals,
           request_limit = EXCLUDED.request_limit
    RETURNING requests, unknown_token_refusals
"""

_KEYS = "rk"  # ratecounter's name for runtime keys' counters
_TOKENS = "rt"  # and for reviewers' access tokens'


def _upsert_seen(
    key: RuntimeKey, window: Window, *, requests: int, refusals: int
) -> tuple[int, int]:
    sql = _UPSERT_SEEN.format(usage=RuntimeKeyUsage._meta.db_table)
    params = (key.pk, window.start, window.seconds, request_limit(key), requests, refusals)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    ratecounter.rows_written(_KEYS, key.pk)
    return int(row[0]), int(row[1])


def request_admit(key: RuntimeKey) -> Admission:
    """Count one request of the key in the current window; say whether it is within the
    limit. The first request of a window also reports the key's ended windows."""
    at = now()
    window = current_window(at)
    limit = request_limit(key)
    counted = None
    if ratecounter.enabled():
        counted = ratecounter.count(_KEYS, key.pk, window.start, window.seconds)
    if counted is None:
        requests, _ = _upsert(key, window, requests=1, refusals=0)
        report = requests == 1
    else:
        requests, rows = counted
        report = requests == 1 and rows
        if report:
            ratecounter.rows_reported(_KEYS, key.pk)
        if requests > limit:
            _upsert_seen(key, window, requests=requests, refusals=0)
    if report:
        usage_report_closed_windows(runtime_key_id=key.pk, at=at)
    return Admission(requests <= limit, requests, limit, window.retry_after(at))


def unknown_token_refusal_counted(key: RuntimeKey) -> bool:
    """Count a refused claim with a token the tenant never issued; True if it is among the
    first ``API_AUDITED_REFUSALS_PER_WINDOW`` of the key's window and so is audited one by
    one, False if only the window's burst event will count it."""
    window = current_window()
    if ratecounter.enabled():
        (requests,) = ratecounter.requests_in(_KEYS, key.pk, [window.start])
        _, refusals = _upsert_seen(key, window, requests=requests or 0, refusals=1)
    else:
        _, refusals = _upsert(key, window, requests=0, refusals=1)
    return refusals <= audited_refusals_per_window()


_TOKEN_UPSERT = """
    INSERT INTO {usage} AS u (reviewer_token_id, window_start, window_seconds, request_limit,
                              requests)
    VALUES (%s, %s, %s, %s, 1)
    ON CONFLICT (reviewer_token_id, window_start) DO UPDATE
       SET requests = u.requests + 1, request_limit = EXCLUDED.request_limit
    RETURNING requests
"""


_TOKEN_UPSERT_SEEN = """
    INSERT INTO {usage} AS u (reviewer_token_id, window_start, window_seconds, request_limit,
                              requests)
    VALUES (%s, %s, %s, %s, %s)
    ON CONFLICT (reviewer_token_id, window_start) DO UPDATE
       SET requests = CASE WHEN EXCLUDED.requests > u.requests
                           THEN EXCLUDED.requests ELSE u.requests END,
           request_limit = EXCLUDED.request_limit
"""


def token_request_admit(token: ReviewerToken) -> Admission:
    """``request_admit`` for a reviewer's access token: its own counter, the same limit."""
    at = now()
    window = current_window(at)
    limit = request_limit(token)
    counted = None
    if ratecounter.enabled():
        counted = ratecounter.count(_TOKENS, token.pk, window.start, window.seconds)
    if counted is None:
        sql = _TOKEN_UPSERT.format(usage=ReviewerTokenUsage._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(sql, (token.pk, window.start, window.seconds, limit))
            (requests,) = cursor.fetchone()
        report = requests == 1
    else:
        requests, rows = counted
        report = requests == 1 and rows
        if report:
            ratecounter.rows_reported(_TOKENS, token.pk)
        if requests > limit:
            sql = _TOKEN_UPSERT_SEEN.format(usage=ReviewerTokenUsage._meta.db_table)
            with connection.cursor() as cursor:
                cursor.execute(sql, (token.pk, window.start, window.seconds, limit, requests))
            ratecounter.rows_written(_TOKENS, token.pk)
    if report:
        token_usage_report_closed_windows(reviewer_token_id=token.pk, at=at)
    return Admission(requests <= limit, int(requests), limit, window.retry_after(at))


# --- reporting ended windows ----------------------------------------------------------------

_TAKE_ENDED = """
    DELETE FROM {usage}
     WHERE window_start + window_seconds <= %s {only_key}
 RETURNING runtime_key_id, window_start, window_seconds, request_limit, requests,
           unknown_token_refusals
"""


class _Ended(NamedTuple):
    runtime_key_id: int
    window_start: int
    window_seconds: int
    request_limit: int
    requests: int
    unknown_token_refusals: int


def _counted(kind: str, caller_id: int, ended: _Ended | _TokenEnded) -> int:
    """An ended window's requests: Redis's count while it has one (the row holds the count
    when it was last written), else the row's."""
    (counted,) = ratecounter.requests_in(kind, caller_id, [ended.window_start])
    return max(ended.requests, counted or 0)


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat()


def usage_report_closed_windows(
    *, runtime_key_id: int | None = None, at: float | None = None
) -> int:
    """Delete the counter rows of windows that have ended (of one key, or of all) and write
    one ``security.refusals_burst`` event for each that held refusals not audited one by
    one. Returns how many events were written. Of two processes reporting the same window,
    the DELETE lets exactly one have its row."""

    moment = now() if at is None else at
    sql = _TAKE_ENDED.format(
        usage=RuntimeKeyUsage._meta.db_table,
        only_key="AND runtime_key_id = %s" if runtime_key_id is not None else "",
    )
    params: list[Any] = [int(moment)]
    if runtime_key_id is not None:
        params.append(runtime_key_id)
    audited = audited_refusals_per_window()
    written = 0
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            ended = [_Ended(*row) for row in cursor.fetchall()]
        if ratecounter.enabled():
            ended = [e._replace(requests=_counted(_KEYS, e.runtime_key_id, e)) for e in ended]
        bursts = [
            e for e in ended if e.requests > e.request_limit or e.unknown_token_refusals > audited
        ]
        if not bursts:
            return 0
        keys = RuntimeKey.objects.in_bulk({e.runtime_key_id for e in bursts})
        for e in sorted(bursts, key=lambda e: (e.runtime_key_id, e.window_start)):
            key = keys.get(e.runtime_key_id)
            if key is None:  # deleted since; its rows went with it (CASCADE)
                continue
            throttled = max(0, e.requests - e.request_limit)
            recorded = min(e.unknown_token_refusals, audited)
            unrecorded = e.unknown_token_refusals - recorded
            audit_record(
                kind=BURST_EVENT,
                tenant=key.tenant_id,
                actor=key.actor,
                reason_code=EventReason.REFUSALS_BURST,
                data={
                    "count": throttled + unrecorded,
                    "window_start": _iso(e.window_start),
                    "window_end": _iso(e.window_start + e.window_seconds),
                    "window_seconds": e.window_seconds,
                    "key_id": key.pk,
                    "key": key.name,
                    "requests": e.requests,
                    "request_limit": e.request_limit,
                    "rate_limited": throttled,
                    "unknown_token_refusals": e.unknown_token_refusals,
                    "unknown_token_refusals_recorded": recorded,
                    "unknown_token_refusals_unrecorded": unrecorded,
                },
            )
            written += 1
    return written


class _TokenEnded(NamedTuple):
    reviewer_token_id: int
    window_start: int
    window_seconds: int
    request_limit: int
    requests: int


_TAKE_ENDED_TOKENS = """
    DELETE FROM {usage}
     WHERE window_start + window_seconds <= %s {only_token}
 RETURNING reviewer_token_id, window_start, window_seconds, request_limit, requests
"""


def token_usage_report_closed_windows(
    *, reviewer_token_id: int | None = None, at: float | None = None
) -> int:
    """``usage_report_closed_windows`` for reviewers' access tokens: one
    ``security.refusals_burst`` event per ended window in which a token went over its
    limit, naming the token and its owner."""
    moment = now() if at is None else at
    sql = _TAKE_ENDED_TOKENS.format(
        usage=ReviewerTokenUsage._meta.db_table,
        only_token="AND reviewer_token_id = %s" if reviewer_token_id is not None else "",
    )
    params: list[Any] = [int(moment)]
    if reviewer_token_id is not None:
        params.append(reviewer_token_id)
    written = 0
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            ended = [_TokenEnded(*row) for row in cursor.fetchall()]
        if ratecounter.enabled():
            ended = [e._replace(requests=_counted(_TOKENS, e.reviewer_token_id, e)) for e in ended]
        bursts = [e for e in ended if e.requests > e.request_limit]
        if not bursts:
            return 0
        found = ReviewerToken.objects.select_related("user").in_bulk(
            {e.reviewer_token_id for e in bursts}
        )
        for e in sorted(bursts, key=lambda e: (e.reviewer_token_id, e.window_start)):
            token = found.get(e.reviewer_token_id)
            if token is None:  # deleted since; its rows went with it (CASCADE)
                continue
            throttled = e.requests - e.request_limit
            audit_record(
                kind=BURST_EVENT,
                tenant=token.tenant_id,
                actor=via(token),
                reason_code=EventReason.REFUSALS_BURST,
                data={
                    "count": throttled,
                    "window_start": _iso(e.window_start),
                    "window_end": _iso(e.window_start + e.window_seconds),
                    "window_seconds": e.window_seconds,
                    "token_id": token.pk,
                    "token": token.name,
                    "owner": str(token.user.get_username()),
                    "requests": e.requests,
                    "request_limit": e.request_limit,
                    "rate_limited": throttled,
                },
            )
            written += 1
    return written


# The name it was first declared under (queued messages and the beat schedule name it).
@shared_task(name="approvals.ratelimit.usage_report_closed", ignore_result=True)
def usage_report_closed() -> int:
    """Report every key's and access token's ended windows (Celery beat, once a window), so
    that the burst of one that went quiet is in the audit trail within a minute of its
    window's end."""
    return usage_report_closed_windows() + token_usage_report_closed_windows()
