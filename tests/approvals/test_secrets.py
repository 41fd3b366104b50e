"""Raw secrets (approval tokens, runtime keys) leave the console exactly once, in the response
that mints them, and nowhere else: not in logs at any level, not in any database row, not
in audit events, not in any other response or command output."""

from __future__ import annotations

import hashlib
import io
import logging
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connection, connections

from approvals.access import tokens
from approvals.models import Approval, AuditEvent, Occurrence
from tests.conftest import REFUND_ARGS, Runtime, approve, make_runtime


@pytest.fixture
def everything_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger at DEBUG, reaching caplog, with SQL statements and their parameters
    logged too, whatever LOG_LEVEL and DEBUG say."""
    caplog.set_level(logging.DEBUG)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            caplog.set_level(logging.DEBUG, logger=name)
            monkeypatch.setattr(logger, "propagate", True)
            monkeypatch.setattr(logger, "disabled", False)
    real_connection = connections[DEFAULT_DB_ALIAS]
    forced = real_connection.force_debug_cursor
    real_connection.force_debug_cursor = True
    try:
        yield caplog
    finally:
        real_connection.force_debug_cursor = forced


def response_text(response: Any) -> str:
    body = b"".join(response.streaming_content) if response.streaming else response.content
    headers = "\n".join(f"{k}: {v}" for k, v in response.items())
    return headers + "\n" + body.decode("utf-8", "replace")


def database_dump() -> str:
    """Every row of every table, each cast to text by PostgreSQL."""
    rows: list[str] = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT t::text FROM {connection.ops.quote_name(table)} AS t")
            rows.extend(f"{table}: {row[0]}" for row in cursor.fetchall())
    return "\n".join(rows)


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    parts = [caplog.text]
    for record in caplog.records:
        parts.append(record.getMessage())
        parts.append(repr(record.msg))
        parts.append(repr(record.args))
        parts.append(repr(vars(record)))
    return "\n".join(parts)


def test_raw_tokens_and_keys_appear_only_in_the_pickup_response(
    everything_logged: pytest.LogCaptureFixture, tenant: Any, reviewer: Any, admin_user: Any
) -> None:
    runtime: Runtime = make_runtime(tenant, "leaky-agent")
    responses: list[Any] = []

    def keep(response: Any) -> Any:
        responses.append(response)
        return response

    # Propose and approve a refund; the runtime picks up its token.
    first = keep(runtime.propose(client_ref="ref-1")).json()["occurrence_id"]
    keep(runtime.propose(client_ref="ref-1"))
    approve(first, reviewer)
    pickup = runtime.token(first)
    token = pickup.json()["token"]
    keep(runtime.token(first))

    # Claim it, redeliver it, replay it, and claim with a token nobody issued.
    assert keep(runtime.claim(token, "exec-a")).json()["decision"] == "approved"
    assert keep(runtime.claim(token, "exec-a")).json()["decision"] == "duplicate_delivery"
    assert keep(runtime.claim(token, "exec-b")).json()["decision"] == "replayed"
    unknown = tokens.APPROVAL_TOKEN_PREFIX + secrets.token_urlsafe(32)
    assert keep(runtime.claim(unknown, "exec-c")).json()["decision"] == "unknown_token"
    assert keep(runtime.claim(token, "")).status_code == 422

    # A second approval is revoked through the management command before it is claimed.
    second = keep(
        runtime.propose(arguments={**REFUND_ARGS, "payment_id": "pay_456"}, client_ref="ref-2")
    ).json()["occurrence_id"]
    approve(second, reviewer)
    second_pickup = runtime.token(second)
    second_token = second_pickup.json()["token"]
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "revoke_approvals",
        fingerprint=tokens.fingerprint(second_token),
        reason="incident 7",
        stdout=out,
        stderr=err,
    )
    assert out.getvalue().strip() == "Revoked 1 approval(s)."
    revoked = keep(
        runtime.claim(second_token, "exec-d", arguments={**REFUND_ARGS, "payment_id": "pay_456"})
    )
    assert revoked.json()["decision"] == "revoked"

    # Everything a runtime or an investigator reads afterwards.
    keep(runtime.get(f"/api/v1/occurrences/{first}"))
    keep(runtime.get(f"/api/v1/occurrences/{second}"))
    keep(runtime.get("/api/v1/audit/events"))
    keep(runtime.client.get("/api/v1/audit/events", HTTP_AUTHORIZATION=f"Bearer {token}"))

    raw_key = runtime.raw_key
    secrets_by_name = {
        "runtime key": raw_key,
        "approval token": token,
        "second approval token": second_token,
        "unknown token": unknown,
    }
    logs = log_text(everything_logged)
    dump = database_dump()
    audit = "\n".join(repr(vars(e)) for e in AuditEvent.objects.all())
    command_output = out.getvalue() + err.getvalue()

    # The checks below can only pass for the right reason if each source was really read.
    assert "approvals" in {r.name for r in everything_logged.records}
    assert "django.db.backends" in {r.name for r in everything_logged.records}
    assert tokens.fingerprint(token) in logs
    assert hashlib.sha256(token.encode()).hexdigest() in dump
    assert hashlib.sha256(raw_key.encode()).hexdigest() in dump
    assert tokens.fingerprint(unknown) in audit
    assert Approval.objects.filter(state=Approval.State.REVOKED).count() == 1
    assert token in response_text(pickup)
    assert second_token in response_text(second_pickup)
    assert len(responses) == 14

    # Findings name the place, never the secret: a failing run must not print it either.
    places = {
        "a log record": logs,
        "a database row": dump,
        "an audit event": audit,
        "command output": command_output,
        **{
            f"response {n} ({r.request['PATH_INFO']})": response_text(r)
            for n, r in enumerate(responses)
        },
        "the first pickup": response_text(pickup),
        "the second pickup": response_text(second_pickup),
    }
    allowed = {
        ("approval token", "the first pickup"),
        ("second approval token", "the second pickup"),
    }
    leaks = [
        f"the {name} is in {place}"
        for name, raw in secrets_by_name.items()
        for place, text in places.items()
        if raw in text and (name, place) not in allowed
    ]
    assert leaks == []


def test_runtime_key_is_stored_only_as_its_hash(tenant: Any) -> None:
    runtime = make_runtime(tenant)

    key = runtime.key
    key.refresh_from_db()
    assert key.key_hash == hashlib.sha256(runtime.raw_key.encode()).hexdigest()
    assert runtime.raw_key not in database_dump()
    assert runtime.raw_key.startswith(key.prefix)
    assert len(key.prefix) < len(runtime.raw_key) // 4


def test_unknown_token_fingerprint_is_recorded_but_the_token_is_not(
    runtime: Runtime, token: str
) -> None:
    unknown = tokens.APPROVAL_TOKEN_PREFIX + secrets.token_urlsafe(32)

    runtime.claim(unknown, "exec-a")

    event = AuditEvent.objects.get(kind="claim.unknown_token")
    assert event.token_fingerprint == tokens.fingerprint(unknown)
    assert unknown not in database_dump()
    assert Occurrence.objects.count() == 1
