"""GET /api/v1/audit/events at scale: the line format clients rely on, the filters, the
newest cursor, and a cursor that never skips an event that commits late."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from approvals.audit import export
from approvals.audit.chain import audit_chain_extend
from approvals.audit.export import (
    AuditFilter,
    _audit_export_orm,
    _audit_export_sql,
    audit_event_line,
    audit_watermark,
)
from approvals.audit.record import audit_record
from approvals.models import AuditEvent, Tenant
from tests.approvals.test_api import error_of, ndjson
from tests.conftest import Runtime

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the export writes its lines in PostgreSQL"
)

# The keys every line had before the chain and ingestion existed: clients read these.
ORIGINAL_KEYS = {
    "cursor",
    "event_id",
    "kind",
    "occurrence_id",
    "actor",
    "token_fingerprint",
    "decision",
    "reason_code",
    "execution_id",
    "message_id",
    "command_id",
    "trace_id",
    "source_time",
    "ingested_at",
    "data",
}
NEW_KEYS = {"chain_seq", "hash", "prev_hash", "ingestion_id"}


def _event(tenant: Tenant, **fields: Any) -> AuditEvent:
    values: dict[str, Any] = {"kind": "test.event", "source_time": timezone.now(), **fields}
    return AuditEvent.objects.create(tenant=tenant, **values)


def _lines(runtime: Runtime, query: str = "") -> list[dict[str, Any]]:
    response = runtime.get(f"/api/v1/audit/events{query}")
    assert response.status_code == 200, response.content
    return ndjson(response)


def _raw(runtime: Runtime, query: str = "") -> str:
    response = runtime.get(f"/api/v1/audit/events{query}")
    assert response.status_code == 200, response.content
    return b"".join(response.streaming_content).decode()


# --- the line format -------------------------------------------------------------------


def test_lines_keep_every_original_key_and_add_only_the_chain_and_ingestion(
    runtime: Runtime, token: str
) -> None:
    runtime.claim(token, "exec-a")

    lines = _lines(runtime)

    assert lines
    for line in lines:
        assert set(line) == ORIGINAL_KEYS | NEW_KEYS
    claim = lines[-1]
    event = AuditEvent.objects.get(pk=claim["cursor"])
    assert claim["kind"] == "claim.approved"
    assert claim["event_id"] == str(event.event_id)
    assert claim["source_time"] == event.source_time.isoformat()
    assert claim["ingested_at"] == event.ingested_at.isoformat()
    assert claim["token_fingerprint"] == event.token_fingerprint
    assert claim["command_id"] == str(event.command_id)
    assert claim["reason_code"] == (event.reason_code or None)
    assert claim["ingestion_id"] is None


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {
            "actor": "rita",
            "token_fingerprint": "0123456789abcdef",
            "decision": "approved",
            "reason_code": "because",
            "execution_id": "exec-1",
            "message_id": "msg-1",
            "command_id": uuid.UUID("8d0f3f0e-2b8e-4d52-9d6c-6f1c3a9a1e01"),
            "trace_id": "trace-1",
            # Keys of one length: jsonb orders them as Python's sort_keys does.
            "data": {"amount": 8000, "flag_1": True, "nulled": None, "listed": [1, "a"]},
        },
        # No fraction of a second: isoformat() writes none.
        {"source_time": datetime(2024, 5, 1, 10, 20, 30, tzinfo=UTC)},
        {"source_time": datetime(2024, 5, 1, 10, 20, 30, 5, tzinfo=UTC)},
        # Escapes: quotes, backslashes, control characters.
        {"actor": 'say "hi"\\ \n\t\x01 end', "execution_id": "a\\b", "data": {"k": "\x1f"}},
    ],
)
def test_a_line_is_byte_for_byte_what_the_python_export_writes(
    runtime: Runtime, fields: dict[str, Any]
) -> None:
    event = _event(runtime.key.tenant, **fields)
    event.refresh_from_db()

    text = _raw(runtime)

    chained = AuditEvent.objects.get(pk=event.pk)
    assert text == audit_event_line(chained)


def test_lines_that_are_spelled_differently_read_back_the_same(runtime: Runtime) -> None:
    # jsonb orders an object's keys by length; Python's export sorts them. PostgreSQL
    # writes non-ASCII characters as they are; Python's export escapes them.
    _event(
        runtime.key.tenant,
        actor="Zoë ✓",
        data={"zz": 1, "a": {"ccc": "é", "b": [{"yy": 2, "x": 3}]}, "émoji": "😀"},
    )

    [line] = _lines(runtime)

    event = AuditEvent.objects.get()
    assert line == json.loads(audit_event_line(event))


@on_postgresql
def test_the_python_and_the_postgresql_export_agree(runtime: Runtime, token: str) -> None:
    runtime.claim(token, "exec-a")
    runtime.claim(token, "exec-b")
    tenant = runtime.key.tenant
    through = audit_chain_extend(tenant_id=tenant.pk)

    for filters in [
        AuditFilter(),
        AuditFilter(kind="claim.*"),
        AuditFilter(kind="claim.replayed"),
        AuditFilter(execution_id="exec-b"),
    ]:
        sql = "".join(_audit_export_sql(tenant.pk, 0, through, filters, None))
        orm = "".join(_audit_export_orm(tenant, 0, through, filters, None))
        assert sql.splitlines()
        assert [json.loads(x) for x in sql.splitlines()] == [
            json.loads(x) for x in orm.splitlines()
        ]


# --- chained before it answers ---------------------------------------------------------


def test_every_exported_event_is_chained(runtime: Runtime, token: str) -> None:
    runtime.claim(token, "exec-a")
    assert AuditEvent.objects.filter(chain_seq__isnull=True).exists()

    lines = _lines(runtime)

    assert [line["chain_seq"] for line in lines] == list(range(1, len(lines) + 1))
    assert lines[0]["prev_hash"] == "0" * 64
    for before, after in itertools.pairwise(lines):
        assert after["prev_hash"] == before["hash"]


# --- filters ---------------------------------------------------------------------------


@pytest.fixture
def mixed(runtime: Runtime, other_runtime: Runtime) -> dict[str, AuditEvent]:
    tenant = runtime.key.tenant
    occurrence_id = runtime.propose().json()["occurrence_id"]
    events = {
        "proposed": AuditEvent.objects.get(kind="occurrence.proposed", tenant=tenant),
        "approved": _event(
            tenant,
            kind="claim.approved",
            token_fingerprint="aaaaaaaaaaaaaaaa",
            execution_id="exec-1",
            occurrence_id=occurrence_id,
            source_time=datetime(2024, 1, 1, tzinfo=UTC),
        ),
        "replayed": _event(
            tenant,
            kind="claim.replayed",
            token_fingerprint="aaaaaaaaaaaaaaaa",
            execution_id="exec-2",
            source_time=datetime(2024, 1, 2, tzinfo=UTC),
        ),
        "claimish": _event(tenant, kind="claimx", source_time=datetime(2024, 1, 3, tzinfo=UTC)),
        "underscore": _event(
            tenant, kind="claim_a.b", source_time=datetime(2024, 1, 4, tzinfo=UTC)
        ),
    }
    other_runtime.propose()
    _event(other_runtime.key.tenant, kind="claim.approved", token_fingerprint="aaaaaaaaaaaaaaaa")
    return events


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("kind=claim.approved", ["approved"]),
        ("kind=claim.*", ["approved", "replayed"]),
        ("kind=claim*", ["approved", "replayed", "claimish", "underscore"]),
        # "_" and "%" are no wildcards in a prefix.
        ("kind=claim_*", ["underscore"]),
        ("kind=nothing.*", []),
        ("fingerprint=aaaaaaaaaaaaaaaa", ["approved", "replayed"]),
        ("execution=exec-2", ["replayed"]),
        ("since=2024-01-02T00:00:00Z", ["proposed", "replayed", "claimish", "underscore"]),
        ("since=2024-01-02T00:00:00", ["proposed", "replayed", "claimish", "underscore"]),
        ("since=2024-01-02T01:00:00%2B01:00", ["proposed", "replayed", "claimish", "underscore"]),
        ("kind=claim.*&since=2024-01-02T00:00:00Z", ["replayed"]),
        ("kind=claim.*&limit=1", ["approved"]),
    ],
)
def test_filters_narrow_the_export_to_the_tenants_matching_events(
    runtime: Runtime, mixed: dict[str, AuditEvent], query: str, expected: list[str]
) -> None:
    lines = _lines(runtime, f"?{query}")

    assert [line["cursor"] for line in lines] == [mixed[name].pk for name in expected]


def test_occurrence_filter(runtime: Runtime, mixed: dict[str, AuditEvent]) -> None:
    occurrence_id = mixed["approved"].occurrence_id

    lines = _lines(runtime, f"?occurrence={occurrence_id}")

    assert [line["kind"] for line in lines] == ["occurrence.proposed", "claim.approved"]


def test_filtered_pages_continue_after_the_last_cursor(
    runtime: Runtime, mixed: dict[str, AuditEvent]
) -> None:
    first = _lines(runtime, "?kind=claim.*&limit=1")
    rest = _lines(runtime, f"?kind=claim.*&after={first[-1]['cursor']}")

    assert [line["cursor"] for line in first + rest] == [
        mixed["approved"].pk,
        mixed["replayed"].pk,
    ]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("kind=claim.**", "kind"),
        ("kind=a%20b", "kind"),
        ("kind=", "kind"),
        ("occurrence=not-a-uuid", "occurrence"),
        ("fingerprint=" + "a" * 17, "fingerprint"),
        ("since=yesterday", "since"),
    ],
)
def test_a_bad_filter_is_422_naming_it(runtime: Runtime, query: str, field: str) -> None:
    response = runtime.get(f"/api/v1/audit/events?{query}")

    assert response.status_code == 422
    assert error_of(response)["details"][0]["field"] == field


# --- the newest cursor -----------------------------------------------------------------


def test_the_cursor_endpoint_answers_the_newest_cursor(
    runtime: Runtime, other_runtime: Runtime
) -> None:
    assert runtime.get("/api/v1/audit/events/cursor").json() == {"cursor": 0}
    runtime.propose(client_ref="a")
    runtime.propose(client_ref="b")
    other_runtime.propose()

    response = runtime.get("/api/v1/audit/events/cursor")

    assert response.status_code == 200
    newest = AuditEvent.objects.filter(tenant=runtime.key.tenant).order_by("id").last()
    assert newest is not None
    assert response.json() == {"cursor": newest.pk}
    assert _lines(runtime, f"?after={newest.pk}") == []
    runtime.propose(client_ref="c")
    assert [line["kind"] for line in _lines(runtime, f"?after={newest.pk}")] == [
        "occurrence.proposed"
    ]


def test_the_cursor_endpoint_needs_a_runtime_key(client: Any) -> None:
    response = client.get("/api/v1/audit/events/cursor")

    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthenticated"


# --- constant work per page -------------------------------------------------------------


def test_the_export_reads_a_fixed_number_of_queries_however_many_events(
    runtime: Runtime,
) -> None:
    def queries_for(events: int) -> int:
        for _ in range(events):
            _event(runtime.key.tenant)
        audit_chain_extend(tenant_id=runtime.key.tenant.pk)
        with connection.execute_wrapper(counter):
            count_before = len(counter.calls)
            lines = _lines(runtime)
            assert len(lines) == AuditEvent.objects.count()
            return len(counter.calls) - count_before

    counter = _Counter()
    _lines(runtime)  # the key's first use writes down that it was used
    assert queries_for(10) == queries_for(200)


class _Counter:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.calls.append(sql)
        return execute(sql, params, many, context)


@on_postgresql
def test_a_large_export_is_paged_by_the_database(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "AUDIT_EXPORT_PAGE", 7)
    tenant = runtime.key.tenant
    created = [_event(tenant, data={"n": n}).pk for n in range(30)]

    lines = _lines(runtime)
    limited = _lines(runtime, "?limit=15")

    assert [line["cursor"] for line in lines] == created
    assert [line["data"]["n"] for line in lines] == list(range(30))
    assert [line["cursor"] for line in limited] == created[:15]


# --- a cursor never skips a late commit (two connections) -------------------------------


def _connect() -> psycopg.Connection[Any]:
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        user=db["USER"] or None,
        password=db["PASSWORD"] or None,
        dbname=db["NAME"],
    )


def _insert_raw(conn: psycopg.Connection[Any], tenant: Tenant, kind: str) -> int:
    """An audit event written by another connection, in its open transaction."""
    row = conn.execute(
        """INSERT INTO approvals_auditevent
               (event_id, kind, tenant_id, actor, token_fingerprint, decision, reason_code,
                execution_id, message_id, trace_id, source_time, ingested_at, data)
           VALUES (%s, %s, %s, '', '', '', '', '', '', '', now(), now(), '{}')
           RETURNING id""",
        [uuid.uuid4(), kind, tenant.pk],
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def other_connections() -> Iterator[list[psycopg.Connection[Any]]]:
    opened: list[psycopg.Connection[Any]] = []
    yield opened
    for conn in opened:
        conn.rollback()
        conn.close()


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_cursor_waits_for_a_lower_id_that_commits_late(
    runtime: Runtime, other_connections: list[psycopg.Connection[Any]]
) -> None:
    tenant = runtime.key.tenant
    runtime.propose(client_ref="before")
    slow = _connect()
    other_connections.append(slow)
    late = _insert_raw(slow, tenant, "test.late")  # drawn first, committed last
    early = audit_record(kind="test.early", tenant=tenant).pk  # committed now
    assert late < early

    first = _lines(runtime)
    cursor = runtime.get("/api/v1/audit/events/cursor").json()["cursor"]

    # Neither the page nor the newest cursor passes the open transaction's id.
    assert [line["kind"] for line in first] == ["occurrence.proposed"]
    assert cursor == first[-1]["cursor"] < late
    slow.commit()
    rest = _lines(runtime, f"?after={first[-1]['cursor']}")
    assert [(line["cursor"], line["kind"]) for line in rest] == [
        (late, "test.late"),
        (early, "test.early"),
    ]
    assert runtime.get("/api/v1/audit/events/cursor").json() == {"cursor": early}


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_cursor_waits_even_for_a_younger_transaction_with_a_lower_id(
    runtime: Runtime, other_connections: list[psycopg.Connection[Any]]
) -> None:
    # The case a check of the rows' xmin against the snapshot's xmin gets wrong: the
    # transaction that commits first began (and took its xid) before the one holding the
    # lower id, so its row's xmin is below every open transaction's.
    tenant = runtime.key.tenant
    older, younger = _connect(), _connect()
    other_connections.extend([older, younger])
    older.execute("SELECT pg_current_xact_id()")
    low = _insert_raw(younger, tenant, "test.younger")
    high = _insert_raw(older, tenant, "test.older")
    older.commit()
    assert low < high

    assert _lines(runtime) == []

    younger.commit()
    assert [line["cursor"] for line in _lines(runtime)] == [low, high]


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_writer_holds_nothing_back(
    runtime: Runtime, other_connections: list[psycopg.Connection[Any]]
) -> None:
    tenant = runtime.key.tenant
    aborted = _connect()
    other_connections.append(aborted)
    _insert_raw(aborted, tenant, "test.aborted")
    kept = audit_record(kind="test.kept", tenant=tenant).pk
    assert _lines(runtime) == []

    aborted.rollback()

    assert [line["cursor"] for line in _lines(runtime)] == [kept]


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_the_chain_waits_for_a_late_commit_too(
    runtime: Runtime, other_connections: list[psycopg.Connection[Any]]
) -> None:
    tenant = runtime.key.tenant
    slow = _connect()
    other_connections.append(slow)
    late = _insert_raw(slow, tenant, "test.late")
    early = audit_record(kind="test.early", tenant=tenant).pk

    audit_chain_extend(tenant_id=tenant.pk)
    assert AuditEvent.objects.get(pk=early).chain_seq is None
    slow.commit()
    audit_chain_extend(tenant_id=tenant.pk)

    chained = AuditEvent.objects.filter(tenant=tenant).order_by("chain_seq")
    assert [(e.pk, e.chain_seq) for e in chained] == [(late, 1), (early, 2)]


def test_the_watermark_counts_the_callers_own_open_writes(runtime: Runtime) -> None:
    # Inside one transaction (as this test runs) its own events are visible to it.
    event = audit_record(kind="test.mine", tenant=runtime.key.tenant)

    assert audit_watermark() >= event.pk


def test_since_is_compared_with_the_source_time(runtime: Runtime) -> None:
    now = timezone.now()
    _event(runtime.key.tenant, kind="old", source_time=now - timedelta(days=2))
    _event(runtime.key.tenant, kind="new", source_time=now)
    since = (now - timedelta(days=1)).isoformat().replace("+00:00", "Z")

    assert [line["kind"] for line in _lines(runtime, f"?since={since}")] == ["new"]
