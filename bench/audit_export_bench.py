"""The audit export (GET /api/v1/audit/events) against PostgreSQL's own COPY.

Seeds a database of its own with N audit events of one tenant (1,010,000 by default, as
in the issue) with INSERT ... SELECT generate_series, chains them (the export serves only
chained events, and the chain is built every few seconds in production), then measures:

  baseline  COPY (SELECT row_to_json(e) FROM approvals_auditevent e ...) TO STDOUT, read
            with psycopg and thrown away (the /dev/null of the issue);
  export    GET /api/v1/audit/events through Django's test Client, the streamed body read
            and thrown away, with the peak growth of this process's resident memory.

It prints both rates and their ratio (export / COPY, events per second), the number to
compare between machines. --python-path also measures the export as it was before
PostgreSQL wrote the lines (Django reads the rows, Python writes the JSON).

    DATABASE_URL=postgres://user@host:5432/console .venv/bin/python bench/audit_export_bench.py
    .venv/bin/python bench/audit_export_bench.py --events 100000 --keep   # seed once ...
    .venv/bin/python bench/audit_export_bench.py --events 100000 --keep   # ... reuse it

DATABASE_URL names the server and credentials only: the bench creates (and drops, unless
--keep) a database of its own, "<name>_audit_bench" by default, and never writes to <name>.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.django_setup import setup_django

setup_django()

from django.conf import settings
from django.db import connection
from django.test import Client

from approvals.access.runtime_keys import runtime_key_create
from approvals.access.tenancy import tenant_create
from approvals.audit.chain import audit_chain_extend
from approvals.audit.export import AuditFilter, _audit_export_orm, audit_watermark
from approvals.models import AuditEvent, Tenant

TENANT_SLUG = "bench"
OTHER_SLUG = "bench-other"
DEFAULT_EVENTS = 1_010_000
KINDS = [
    "occurrence.proposed",
    "approval.vote",
    "approval.issued",
    "token.delivered",
    "claim.approved",
    "claim.duplicate_delivery",
    "claim.replayed",
    "effect.sending",
    "effect.committed",
    "dispatch.redelivered",
]


# --- seeding -----------------------------------------------------------------------------


def seed(tenant_id: int, other_id: int, events: int) -> float:
    """``events`` audit events of the tenant, shaped like the console's (every third one a
    claim with a fingerprint, an execution and a command), and a few of another tenant."""
    kinds = "ARRAY[" + ",".join(f"'{k}'" for k in KINDS) + "]"
    table = AuditEvent._meta.db_table
    columns = """(event_id, kind, tenant_id, occurrence_id, actor, token_fingerprint, decision,
        reason_code, execution_id, message_id, command_id, trace_id, source_time,
        ingested_at, data)"""
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for tenant, count in [(tenant_id, events), (other_id, max(1, events // 100))]:
            cursor.execute(
                f"""INSERT INTO {table} {columns}
                SELECT gen_random_uuid(), ({kinds})[1 + e % {len(KINDS)}], {tenant}, NULL,
                    CASE WHEN e % 2 = 0 THEN 'runtime' ELSE 'bench-reviewer' END,
                    CASE WHEN e % 3 = 0 THEN left(md5(e::text), 16) ELSE '' END,
                    CASE WHEN e % 3 = 0 THEN 'approved' ELSE '' END,
                    CASE WHEN e % 7 = 0 THEN 'consumed_by_other_execution' ELSE '' END,
                    CASE WHEN e % 3 = 0 THEN 'exec-' || e ELSE '' END,
                    CASE WHEN e % 5 = 0 THEN 'msg-' || e ELSE '' END,
                    CASE WHEN e % 3 = 0 THEN gen_random_uuid() END,
                    md5(e::text),
                    now() - ({count} - e) * interval '25 ms',
                    now(),
                    jsonb_build_object('n', e, 'reason', 'Customer ticket ' || e)
                FROM generate_series(1, {count}) AS e"""
            )
        # Statistics, as a table in use has them: without them the planner would take the
        # chain's UPDATE of a thousand rows for one of a tiny table (a scan of all of it).
        cursor.execute(f"ANALYZE {table}")
    return time.perf_counter() - started


def prepare(events: int) -> tuple[Tenant, str, float | None, float | None]:
    """The bench tenant with its events chained, and a runtime key's raw value; the seconds
    seeding and chaining took (None when a kept database was reused)."""
    tenant = Tenant.objects.filter(slug=TENANT_SLUG).first()
    if tenant is not None and AuditEvent.objects.filter(tenant=tenant).count() != events:
        raise StaleBenchDatabase
    seeded = None
    if tenant is None:
        tenant = tenant_create(slug=TENANT_SLUG, name="Bench Shop")
        other = tenant_create(slug=OTHER_SLUG, name="Another Shop")
        seeded = seed(tenant.pk, other.pk, events)
    started = time.perf_counter()
    with secondary_indexes_dropped():
        audit_chain_extend(tenant_id=tenant.pk)
    chained = time.perf_counter() - started if seeded is not None else None
    with connection.cursor() as cursor:
        # The chain rewrote every row once; the export and the baseline read the same
        # (vacuumed) table.
        cursor.execute(f"VACUUM ANALYZE {AuditEvent._meta.db_table}")
    _, raw_key = runtime_key_create(tenant=tenant, name=f"bench-{time.time_ns()}")
    return tenant, raw_key, seeded, chained


@contextlib.contextmanager
def secondary_indexes_dropped() -> Iterator[None]:
    """Chaining a backlog of a million seeded events rewrites every row once; with every
    secondary index in place (one of them on a random UUID) that is mostly random reads
    of index pages. As a bulk load would, drop the indexes the chain extension does not
    read for the while and rebuild them after, so that the export and the baseline are
    measured on the table exactly as migrated."""
    table = AuditEvent._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT i.relname, pg_get_indexdef(i.oid)
                 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
                WHERE x.indrelid = %s::regclass AND NOT x.indisprimary""",
            [table],
        )
        dropped = [
            (name, definition)
            for name, definition in cursor.fetchall()
            # The tenant's ids, the unchained ones, and the chain's own constraint stay.
            if not definition.endswith("(tenant_id, id)")
            and name not in {"audit_unchained", "audit_chain_seq_unique"}
        ]
        for name, _ in dropped:
            cursor.execute(f'DROP INDEX "{name}"')
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for _, definition in dropped:
                cursor.execute(definition)


class StaleBenchDatabase(Exception):
    """A kept bench database seeded with another number of events."""


# --- measuring ---------------------------------------------------------------------------


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak so far (kilobytes on Linux, bytes on macOS)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class PeakMemory:
    """The growth of resident memory above its level at the start, sampled every 5 ms."""

    def __init__(self) -> None:
        self.start = _rss_bytes()
        self.peak = self.start
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.start) / 1e6


@dataclass
class Run:
    label: str
    events: int
    size: int
    seconds: float
    memory_mb: float

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    def row(self) -> str:
        return (
            f"{self.label:<34} {self.events:>11,} {self.size / 1e6:>9.1f} {self.seconds:>8.2f}"
            f" {self.rate:>12,.0f} {self.size / 1e6 / self.seconds:>8.1f}"
            f" {self.memory_mb:>9.1f}"
        )


def _consume(label: str, produce: Callable[[], Iterable[bytes | str]]) -> Run:
    size = lines = 0
    with PeakMemory() as memory:
        started = time.perf_counter()
        for chunk in produce():
            data = chunk.encode() if isinstance(chunk, str) else chunk
            size += len(data)
            lines += data.count(b"\n")
        seconds = time.perf_counter() - started
    return Run(label, lines, size, seconds, memory.growth_mb)


def baseline(tenant: Tenant) -> Run:
    sql = (
        f"COPY (SELECT row_to_json(e) FROM {AuditEvent._meta.db_table} e"
        f" WHERE e.tenant_id = {int(tenant.pk)} ORDER BY e.id) TO STDOUT"
    )

    def rows() -> Iterable[bytes]:
        with connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
            for chunk in copy:
                yield bytes(chunk)

    return _consume("COPY (SELECT row_to_json(e)) TO", rows)


def export(raw_key: str) -> Run:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    # The first request of the process loads and builds what every later one reuses.
    client.get("/api/v1/audit/events?limit=1").getvalue()

    def body() -> Iterable[bytes]:
        response = client.get("/api/v1/audit/events")
        if response.status_code != 200:
            raise SystemExit(f"the export answered {response.status_code}: {response.content!r}")
        yield from response.streaming_content  # type: ignore[attr-defined]

    return _consume("GET /api/v1/audit/events", body)


def python_export(tenant: Tenant) -> Run:
    through = audit_watermark()

    def body() -> Iterable[str]:
        return _audit_export_orm(tenant, 0, through, AuditFilter(), None)

    return _consume("the same lines written by Python", body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--events", type=int, default=DEFAULT_EVENTS, help="events of the exported tenant"
    )
    parser.add_argument("--repeat", type=int, default=1, help="measure each this many times")
    parser.add_argument(
        "--db-name", help="database to create and seed (default: <DATABASE_URL name>_audit_bench)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the seeded database and reuse it next time"
    )
    parser.add_argument(
        "--python-path",
        action="store_true",
        help="also measure the Python export (the one SQLite uses; slow at full size)",
    )
    args = parser.parse_args(argv)

    if connection.vendor != "postgresql":
        print(
            "audit_export_bench needs PostgreSQL: set DATABASE_URL=postgres://...", file=sys.stderr
        )
        return 2
    if args.events < 1 or args.repeat < 1:
        parser.error("--events and --repeat must be at least 1")

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    original = connection.settings_dict["NAME"]
    connection.settings_dict.setdefault("TEST", {})["NAME"] = (
        args.db_name or f"{original}_audit_bench"
    )
    with contextlib.redirect_stderr(io.StringIO()):
        name = connection.creation.create_test_db(
            verbosity=0, autoclobber=True, serialize=False, keepdb=args.keep
        )
    try:
        try:
            tenant, raw_key, seeded, chained = prepare(args.events)
        except StaleBenchDatabase:
            connection.creation.destroy_test_db(original, verbosity=0)
            with contextlib.redirect_stderr(io.StringIO()):
                connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
            tenant, raw_key, seeded, chained = prepare(args.events)
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            server = cursor.fetchone()[0]
        how = "reused" if seeded is None else f"seeded in {seeded:.1f} s"
        print(
            f"audit_export_bench: database {name} (PostgreSQL {server}): {args.events:,} audit"
            f" events of one tenant ({how})"
        )
        if chained is not None:
            print(f"chained in {chained:.1f} s ({args.events / chained:,.0f} events/s)")
        print()
        print(
            f"{'':<34} {'events':>11} {'MB':>9} {'seconds':>8} {'events/s':>12} {'MB/s':>8}"
            f" {'RSS +MB':>9}"
        )
        runs: list[tuple[Run, Run]] = []
        for _ in range(args.repeat):
            copy_run, export_run = baseline(tenant), export(raw_key)
            if export_run.events != args.events:
                print(f"the export wrote {export_run.events:,} lines", file=sys.stderr)
                return 1
            runs.append((copy_run, export_run))
            print(copy_run.row())
            print(export_run.row())
        if args.python_path:
            print(python_export(tenant).row())
        best_copy = max(r[0].rate for r in runs)
        best_export = max(r[1].rate for r in runs)
        print()
        print(f"ratio export/COPY: {best_export / best_copy:.2f}")
        print(f"peak RSS growth of the export: {max(r[1].memory_mb for r in runs):.1f} MB")
        return 0
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(original, verbosity=0)


if __name__ == "__main__":
    sys.exit(main())
