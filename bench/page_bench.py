"""Server time and query counts of the reviewer pages on a large PostgreSQL database.

Seeds a database of its own (100k occurrences with their proposals, approvals, epochs and
commands, and 1M audit events at --scale 1) with INSERT ... SELECT generate_series, then
requests each page in-process with Django's test Client and prints p50/p95 server time,
the number of SQL queries, and the ratio to a baseline: a trivial template rendered
through the same middleware, session and login in the same run. The ratio is the number to
compare between machines; the milliseconds are this machine's.

    DATABASE_URL=postgres://user@host:5432/console .venv/bin/python bench/page_bench.py
    .venv/bin/python bench/page_bench.py --scale 0.1 --iterations 20
    .venv/bin/python bench/page_bench.py --keep          # keep the seeded database ...
    .venv/bin/python bench/page_bench.py --keep          # ... and reuse it next time

DATABASE_URL names the server and credentials only: the bench creates (and drops, unless
--keep) a database of its own, "<name>_page_bench" by default, and never writes to <name>.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
import types
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.django_setup import setup_django

setup_django()

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from django.template import engines
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import clear_url_caches, include, path

from approvals.access.runtime_keys import runtime_key_create
from approvals.access.tenancy import tenant_create
from approvals.canonical.form import canonicalize
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Command,
    Epoch,
    Membership,
    Occurrence,
    Proposal,
    ToolContract,
)
from config.heap import freeze_startup_heap

OCCURRENCES_AT_SCALE_1 = 100_000
AUDIT_EVENTS_AT_SCALE_1 = 1_000_000
# Two occurrences with long histories, which pages must survive: a claimed one whose
# spent token a misbehaving runtime keeps replaying, and an approved one whose still-valid
# token a runtime keeps presenting with the wrong arguments. The second is not final, so
# its page polls the decision panel every few seconds.
HOT_OCCURRENCE = 14
HOT_ISSUED = 11
HOT_EVENTS_AT_SCALE_1 = 5_000
TENANT_SLUG = "bench"
# The aim for every page's p95 at scale 1 (bench/README.md, "The console's pages on a large
# database").
AIM_P95_MS = 30.0
REVIEWER = "bench-reviewer"
OPERATOR = "bench-operator"

# --- the baseline: a trivial template through the same stack --------------------------

BASELINE_TEMPLATE = engines["django"].from_string(
    "<!doctype html><html><head><title>{{ title }}</title></head>"
    "<body><p>Signed in as {{ request.user.get_username }}</p></body></html>"
)


@login_required
def baseline_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(BASELINE_TEMPLATE.render({"title": "baseline"}, request))


BASELINE_PATH = "/__bench__/baseline/"
URLCONF = "page_bench_urls"


def install_urlconf() -> None:
    """The project's URLs plus the baseline view, without touching config/urls.py."""
    module = types.ModuleType(URLCONF)
    module.urlpatterns = [  # type: ignore[attr-defined]
        path(BASELINE_PATH.strip("/") + "/", baseline_view),
        path("", include(settings.ROOT_URLCONF)),
    ]
    sys.modules[URLCONF] = module
    settings.ROOT_URLCONF = URLCONF
    clear_url_caches()


# --- seeding -----------------------------------------------------------------------------


HOT_OCCURRENCE_ID = f"00000000-0000-4000-8000-{HOT_OCCURRENCE:012x}"
HOT_ISSUED_ID = f"00000000-0000-4000-8000-{HOT_ISSUED:012x}"


def occ_id(g: str) -> str:
    """SQL for the deterministic occurrence UUID number g, so that later INSERTs can point
    at occurrences by arithmetic instead of by joining."""
    return f"('00000000-0000-4000-8000-' || lpad(to_hex({g}), 12, '0'))::uuid"


# RFC 8785 canonical JSON built in SQL: keys sorted, no whitespace, integers as digits.
# The bench checks a sample against approvals.canonical afterwards.
def canonical_sql(g: str, version: str) -> str:
    amount = f"(100 + ({g} * 7919 + {version} * 500) % 49900)"
    return f"""CASE
        WHEN {g} % 10 = 3 THEN
            '{{"arguments":{{"order_id":"' || {g} || '"}},"tool":"lookup_order"}}'
        WHEN ({g} / 10) % 3 = 0 THEN
            '{{"arguments":{{"body":"Hi, your order ' || {g} || ' has shipped (v' || {version}
            || ').\\n","subject":"Order ' || {g} || ' update","to":"customer' || {g}
            || '@example.com"}},"tool":"send_message"}}'
        ELSE
            '{{"arguments":{{"amount_minor":' || {amount} || ',"currency":"EUR","payment_id":"pay_'
            || {g} || '","reason":"Order ' || {g} || ' arrived damaged"}},"tool":"issue_refund"}}'
    END"""


def digest_sql(canonical: str) -> str:
    return f"encode(sha256(convert_to({canonical}, 'UTF8')), 'hex')"


def status_sql(g: str) -> str:
    return f"""CASE {g} % 10
        WHEN 0 THEN 'pending_review' WHEN 1 THEN 'approved' WHEN 2 THEN 'rejected'
        WHEN 3 THEN 'auto_admitted' ELSE 'claimed' END"""


def tool_sql(g: str) -> str:
    return f"""CASE WHEN {g} % 10 = 3 THEN 'lookup_order'
        WHEN ({g} / 10) % 3 = 0 THEN 'send_message' ELSE 'issue_refund' END"""


AUDIT_KINDS = [
    "occurrence.proposed",
    "approval.vote_recorded",
    "approval.issued",
    "token.delivered",
    "claim.approved",
    "claim.duplicate_delivery",
    "claim.replayed",
    "proposal.edited",
    "occurrence.rejected",
    "approval.revoked",
]


@dataclass
class Seeded:
    long_history: int
    occurrences: int
    proposals: int
    audit_events: int
    seconds: float
    reused: bool


def counts() -> tuple[int, int, int]:
    return (Occurrence.objects.count(), Proposal.objects.count(), AuditEvent.objects.count())


def seed(*, n: int, m: int, hot: int, tenant_id: int, key_id: int, reviewer: Any) -> float:
    """Insert n occurrences and m audit events with everything between; return seconds."""
    started = time.perf_counter()
    tools = dict(ToolContract.objects.values_list("name", "id"))
    tool_id = f"""CASE WHEN g % 10 = 3 THEN {tools["lookup_order"]}
        WHEN (g / 10) % 3 = 0 THEN {tools["send_message"]} ELSE {tools["issue_refund"]} END"""
    # Occurrence g was created g * 30 s ago: the newest have the smallest numbers.
    created = "now() - g * interval '30 seconds'"
    kinds = "ARRAY[" + ",".join(f"'{k}'" for k in AUDIT_KINDS) + "]"
    statements = [
        f"""INSERT INTO {Occurrence._meta.db_table}
            (id, tenant_id, runtime_key_id, tool_id, run_id, reason, requested_by, client_ref,
             status, admission_justification, rejection_reason, decided_at, created_at,
             updated_at)
        SELECT {occ_id("g")}, {tenant_id}, {key_id}, {tool_id}, 'run-' || (g / 7),
            'Customer ticket ' || g || ': the agent proposes this after reading the thread.',
            'support-agent', 'ref-' || g, {status_sql("g")},
            CASE WHEN g % 10 = 3 THEN 'read_only' ELSE '' END,
            CASE WHEN g % 10 = 2 THEN 'Outside the refund window.' ELSE '' END,
            CASE WHEN g % 10 = 0 THEN NULL ELSE {created} + interval '2 minutes' END,
            {created}, {created} + interval '5 minutes'
        FROM generate_series(1, {n}) AS g""",
        # Version 1 of every occurrence; every other pending one was edited into version 2.
        f"""INSERT INTO {Proposal._meta.db_table}
            (occurrence_id, version, canonical_action, action_digest, is_current, edited_by_id,
             created_at)
        SELECT {occ_id("g")}, 1, c, {digest_sql("c")}, NOT (g % 20 = 0), NULL, {created}
        FROM generate_series(1, {n}) AS g, LATERAL (SELECT {canonical_sql("g", "1")} AS c) x""",
        f"""INSERT INTO {Proposal._meta.db_table}
            (occurrence_id, version, canonical_action, action_digest, is_current, edited_by_id,
             created_at)
        SELECT {occ_id("g")}, 2, c, {digest_sql("c")}, true, {reviewer.pk},
            {created} + interval '1 minute'
        FROM generate_series(20, {n}, 20) AS g,
            LATERAL (SELECT {canonical_sql("g", "2")} AS c) x""",
        f"""INSERT INTO {ApprovalVote._meta.db_table}
            (proposal_id, reviewer_id, seen_digest, created_at)
        SELECT p.id, {reviewer.pk}, p.action_digest, o.created_at + interval '2 minutes'
        FROM {Proposal._meta.db_table} p JOIN {Occurrence._meta.db_table} o
            ON o.id = p.occurrence_id
        WHERE o.status IN ('approved', 'claimed')""",
        f"""INSERT INTO {Approval._meta.db_table}
            (tenant_id, occurrence_id, proposal_id, approver_id, tool_name, action_digest,
             proposal_version, state, token_hash, fingerprint, issued_at, expires_at,
             delivered_at, superseded_at, consumed_at, consumed_by_execution, revoked_at,
             revoked_by, revoke_reason)
        SELECT o.tenant_id, o.id, p.id, {reviewer.pk}, t.name, p.action_digest, p.version,
            CASE WHEN o.status = 'claimed' THEN 'consumed' ELSE 'issued' END,
            CASE WHEN o.status = 'claimed'
                THEN encode(sha256(convert_to('tok-' || o.id, 'UTF8')), 'hex') END,
            CASE WHEN o.status = 'claimed'
                THEN left(encode(sha256(convert_to('fp-' || o.id, 'UTF8')), 'hex'), 16)
                ELSE '' END,
            o.created_at + interval '2 minutes',
            CASE WHEN o.id = '{HOT_ISSUED_ID}' THEN now() + interval '30 days'
                ELSE o.created_at + interval '17 minutes' END,
            CASE WHEN o.status = 'claimed' THEN o.created_at + interval '3 minutes' END,
            NULL,
            CASE WHEN o.status = 'claimed' THEN o.created_at + interval '4 minutes' END,
            CASE WHEN o.status = 'claimed' THEN 'exec-' || o.id ELSE '' END,
            NULL, '', ''
        FROM {Occurrence._meta.db_table} o
            JOIN {Proposal._meta.db_table} p ON p.occurrence_id = o.id AND p.is_current
            JOIN {ToolContract._meta.db_table} t ON t.id = o.tool_id
        WHERE o.status IN ('approved', 'claimed')""",
        f"""INSERT INTO {Epoch._meta.db_table}
            (id, occurrence_id, number, execution_id, justification, previous_id, created_at)
        SELECT gen_random_uuid(), a.occurrence_id, 1, a.consumed_by_execution, 'approval',
            NULL, a.consumed_at
        FROM {Approval._meta.db_table} a WHERE a.state = 'consumed'""",
        f"""INSERT INTO {Command._meta.db_table}
            (id, tenant_id, occurrence_id, approval_id, epoch_id, execution_id,
             idempotency_key, action_digest, state, executed_by, created_at, updated_at)
        SELECT x.cid, x.tenant_id, x.occurrence_id, x.approval_id, x.epoch_id, x.execution_id,
            'cmd_' || replace(x.cid::text, '-', ''), x.action_digest, 'committed', 'console',
            x.created_at, x.created_at
        FROM (
            SELECT gen_random_uuid() AS cid, a.tenant_id, a.occurrence_id, a.id AS approval_id,
                e.id AS epoch_id, e.execution_id, a.action_digest, e.created_at
            FROM {Approval._meta.db_table} a
                JOIN {Epoch._meta.db_table} e ON e.occurrence_id = a.occurrence_id
            WHERE a.state = 'consumed'
        ) x""",
        # About ten events per occurrence, interleaved the way a busy tenant writes them.
        f"""INSERT INTO {AuditEvent._meta.db_table}
            (event_id, kind, tenant_id, occurrence_id, actor, token_fingerprint, decision,
             reason_code, execution_id, message_id, command_id, trace_id, source_time,
             ingested_at, data)
        SELECT gen_random_uuid(), ({kinds})[1 + (e / {n}) % {len(AUDIT_KINDS)}],
            {tenant_id}, {occ_id(f"1 + (e - 1) % {n}")},
            CASE WHEN (e / {n}) % 2 = 0 THEN 'runtime' ELSE '{REVIEWER}' END,
            '', '', '', '', '', NULL, md5(e::text),
            now() - ((1 + (e - 1) % {n}) * interval '30 seconds') + (e / {n}) * interval '1 s',
            now(), jsonb_build_object('n', e)
        FROM generate_series(1, {m}) AS e""",
        f"""INSERT INTO {AuditEvent._meta.db_table}
            (event_id, kind, tenant_id, occurrence_id, actor, token_fingerprint, decision,
             reason_code, execution_id, message_id, command_id, trace_id, source_time,
             ingested_at, data)
        SELECT gen_random_uuid(), 'claim.replayed', {tenant_id}, {occ_id(str(HOT_OCCURRENCE))},
            'runtime', a.fingerprint, 'replayed', 'consumed_by_other_execution',
            'exec-replay-' || e, 'msg-' || e, NULL, md5(e::text),
            now() - interval '1 hour' + e * interval '10 ms', now(), '{{}}'::jsonb
        FROM generate_series(1, {hot}) AS e, {Approval._meta.db_table} a
        WHERE a.occurrence_id = {occ_id(str(HOT_OCCURRENCE))}""",
        f"""INSERT INTO {AuditEvent._meta.db_table}
            (event_id, kind, tenant_id, occurrence_id, actor, token_fingerprint, decision,
             reason_code, execution_id, message_id, command_id, trace_id, source_time,
             ingested_at, data)
        SELECT gen_random_uuid(), 'claim.scope_mismatch', {tenant_id}, '{HOT_ISSUED_ID}',
            'runtime', '', 'scope_mismatch', 'action_differs',
            'exec-retry-' || e, 'msg-' || e, NULL, md5(e::text),
            now() - interval '1 hour' + e * interval '10 ms', now(), '{{}}'::jsonb
        FROM generate_series(1, {hot}) AS e""",
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)
    # What autovacuum does to a live database soon after such a load (the server may have
    # it off): statistics, and the visibility map that lets index-only scans skip the
    # table, so that a freshly seeded database is measured as one in service would be.
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


def check_seeded_digests() -> None:
    """The SQL-built canonical JSON must be what the console itself would have built."""
    for proposal in Proposal.objects.order_by("?")[:20]:
        action = json.loads(proposal.canonical_action)
        canonical = canonicalize(action["tool"], action["arguments"])
        assert canonical.canonical == proposal.canonical_action, proposal.canonical_action
        assert canonical.digest == proposal.action_digest, proposal.pk


def prepare(scale: float) -> tuple[Seeded, Any]:
    n = max(10, round(OCCURRENCES_AT_SCALE_1 * scale))
    m = max(10, round(AUDIT_EVENTS_AT_SCALE_1 * scale))
    hot = max(10, round(HOT_EVENTS_AT_SCALE_1 * scale))
    User = get_user_model()
    reviewer = User.objects.filter(username=REVIEWER).first()
    if reviewer is not None and counts()[0] == n and counts()[2] == m + 2 * hot:
        occurrences, proposals, events = counts()
        return Seeded(hot, occurrences, proposals, events, 0.0, reused=True), reviewer
    if reviewer is not None:
        raise StaleBenchDatabase
    tenant = tenant_create(slug=TENANT_SLUG, name="Bench Shop")
    key, _ = runtime_key_create(tenant=tenant, name="bench-runtime")
    reviewer = User.objects.create_user(username=REVIEWER, password="bench-password-unused")
    Membership.objects.create(user=reviewer, tenant=tenant, role=Membership.Role.REVIEWER)
    seconds = seed(n=n, m=m, hot=hot, tenant_id=tenant.pk, key_id=key.pk, reviewer=reviewer)
    check_seeded_digests()
    occurrences, proposals, events = counts()
    return Seeded(hot, occurrences, proposals, events, seconds, reused=False), reviewer


def operator_of(reviewer: Any) -> Any:
    """The bench's operator, in the reviewer's tenant (added to a kept database too)."""
    user, _ = get_user_model().objects.get_or_create(username=OPERATOR)
    tenant_id = Membership.objects.filter(user=reviewer).values_list("tenant_id", flat=True)[0]
    Membership.objects.get_or_create(user=user, tenant_id=tenant_id, role=Membership.Role.OPERATOR)
    return user


class StaleBenchDatabase(Exception):
    """A kept bench database seeded at another scale (or by an older bench)."""


# --- measuring -------------------------------------------------------------------------


class _PollFinder(HTMLParser):
    """Finds the element htmx polls (hx-trigger="every ...") and the URL it polls."""

    def __init__(self) -> None:
        super().__init__()
        self.found: tuple[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        trigger, url = values.get("hx-trigger") or "", values.get("hx-get")
        if self.found is None and url and trigger.strip().startswith("every"):
            self.found = (values.get("id") or "", url)


def poll_target(html: str) -> tuple[str, str] | None:
    """(element id, URL) of the page's polling element, if it polls."""
    finder = _PollFinder()
    finder.feed(html)
    return finder.found


@dataclass
class Page:
    label: str
    path: str
    headers: dict[str, str]
    # A poll whose content has not changed answers 204 No Content.
    statuses: tuple[int, ...] = (200,)
    # A poll's 200 replaces the polling element, and with it the URL of the next poll (its
    # stamp): a page that changed, or whose stamp includes the minute, polls as htmx would.
    follows_poll: bool = False
    # Requested by the bench's operator (the operations console and investigations).
    as_operator: bool = False


@dataclass
class Result:
    label: str
    p50_ms: float
    p95_ms: float
    queries: int
    sql: list[dict[str, str]]


class PageError(Exception):
    pass


class Requester:
    """Requests one page as the bench's client; a poll follows the URL its answer names."""

    def __init__(self, client: Client, page: Page) -> None:
        self.client = client
        self.page = page
        self.path = page.path
        self.timings: list[float] = []

    def get(self) -> Any:
        page = self.page
        response = self.client.get(self.path, headers=page.headers)
        if response.status_code not in page.statuses:
            raise PageError(f"{page.label}: GET {self.path} answered {response.status_code}")
        if page.follows_poll and response.status_code == 200:
            found = poll_target(response.content.decode())
            self.path = found[1] if found else self.path
        return response

    def timed_get(self) -> None:
        started = time.perf_counter()
        self.get()
        self.timings.append((time.perf_counter() - started) * 1000)

    def result(self) -> Result:
        # Counted on a separate request, so that capturing queries does not slow the timed ones.
        with CaptureQueriesContext(connection) as queries:
            self.get()
        ordered = sorted(self.timings)
        p95_index = max(0, min(len(ordered) - 1, round(0.95 * len(ordered)) - 1))
        return Result(
            self.page.label,
            statistics.median(ordered),
            ordered[p95_index],
            len(queries),
            list(queries.captured_queries),
        )


def measure_all(requesters: list[Requester], iterations: int, warmup: int) -> list[Result]:
    """Every page ``warmup`` times, then ``iterations`` rounds of one timed request per page,
    in turn: a machine that slows down or speeds up during the run (a shared CPU) does so
    for every page and for the baseline alike, so that their ratios and percentiles compare."""
    for requester in requesters:
        for _ in range(warmup):
            requester.get()
    for _ in range(iterations):
        for requester in requesters:
            requester.timed_get()
    return [requester.result() for requester in requesters]


def pages(client: Client) -> list[Page]:
    # The newest claimed occurrence (approval consumed, a command, about ten audit events)
    # and the newest pending one in its second version (a version diff to render).
    consumed = str(
        Occurrence.objects.filter(status=Occurrence.Status.CLAIMED)
        .order_by("-created_at")
        .values_list("pk", flat=True)[0]
    )
    edited = str(
        Proposal.objects.filter(version=2, occurrence__status=Occurrence.Status.PENDING_REVIEW)
        .order_by("-created_at")
        .values_list("occurrence_id", flat=True)[0]
    )
    result = [
        Page("baseline: trivial template", BASELINE_PATH, {}),
        Page("inbox /reviews/", "/reviews/", {}),
        Page("inbox, tool=send_message", "/reviews/?tool=send_message", {}),
        Page("inbox, page 100", "/reviews/?page=100", {}),
    ]
    result += _poll(client, "/reviews/", "inbox poll, unchanged")
    result += [
        Page("review, consumed", f"/reviews/{consumed}/", {}),
        Page("review, pending v2", f"/reviews/{edited}/", {}),
        Page("review, long history, final", f"/reviews/{HOT_OCCURRENCE_ID}/", {}),
        Page("review, long history, issued", f"/reviews/{HOT_ISSUED_ID}/", {}),
    ]
    # The history's pages: the window the "Earlier events" link opens, deep in the history.
    result += _earlier(client, f"/reviews/{HOT_OCCURRENCE_ID}/", "review, long history, earlier")
    # A final state does not poll; a pending or issued page does, every couple of seconds.
    result += _poll(client, f"/reviews/{edited}/", "panel poll, unchanged")
    result += _poll(client, f"/reviews/{HOT_ISSUED_ID}/", "panel poll, long history")
    # The operators' pages: the queue (every approval the seed left issued has expired
    # unclaimed: a tenth of all), the long history's timeline, and an investigation of
    # one of its refused replays (the chain reads the newest 500 of its events).
    result += [
        Page("operations queue", "/operations/", {}, as_operator=True),
        Page(
            "operations, long history",
            f"/operations/occurrences/{HOT_OCCURRENCE_ID}/",
            {},
            as_operator=True,
        ),
        Page(
            "investigation, replayed token",
            "/investigations/?q=exec-replay-7",
            {},
            as_operator=True,
        ),
    ]
    return result


class _EarlierFinder(HTMLParser):
    """Finds the history pager's link to the earlier events (rel="prev")."""

    def __init__(self) -> None:
        super().__init__()
        self.found: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if self.found is None and tag == "a" and values.get("rel") == "prev":
            href = values.get("href") or ""
            self.found = href.split("#")[0] if "before=" in href else None


def _earlier(client: Client, page_path: str, label: str, steps: int = 50) -> list[Page]:
    """The review page with an earlier window of its history, found by following its
    "Earlier events" link up to ``steps`` times (each hop is a keyset cursor, so the last
    is as cheap as the first); none when the history fits in one window."""
    url = None
    for _ in range(steps):
        finder = _EarlierFinder()
        finder.feed(client.get(url or page_path).content.decode())
        if finder.found is None:
            break
        url = finder.found
    return [] if url is None else [Page(label, url, {})]


def _poll(client: Client, page_path: str, label: str) -> list[Page]:
    """The request htmx sends when the page's polling element fires, if it has one."""
    found = poll_target(client.get(page_path).content.decode())
    if found is None:
        return []
    element_id, url = found
    headers = {
        "HX-Request": "true",
        "HX-Target": element_id,
        "HX-Trigger": element_id,
        "HX-Current-URL": f"http://testserver{page_path}",
    }
    return [Page(f"{label} (htmx)", url, headers, statuses=(200, 204), follows_poll=True)]


def table(results: list[Result]) -> str:
    baseline = results[0].p50_ms
    lines = [
        f"{'page':<32} {'p50 ms':>8} {'p95 ms':>8} {'queries':>8} {'p50 / baseline':>15}",
        "-" * 75,
    ]
    for r in results:
        ratio = r.p50_ms / baseline if baseline else float("nan")
        lines.append(
            f"{r.label:<32} {r.p50_ms:>8.2f} {r.p95_ms:>8.2f} {r.queries:>8} {ratio:>14.1f}x"
        )
    pages = results[1:]
    if pages:
        slowest = max(pages, key=lambda r: r.p95_ms)
        over = [r for r in pages if r.p95_ms > AIM_P95_MS]
        lines += [
            "-" * 75,
            f"slowest p95: {slowest.p95_ms:.2f} ms ({slowest.label}); "
            f"{len(over)} of {len(pages)} pages above the {AIM_P95_MS:g} ms aim",
        ]
    return "\n".join(lines)


# --- the run ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="1.0 = 100k occurrences, 1M audit events"
    )
    parser.add_argument("--iterations", type=int, default=50, help="timed requests per page")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests per page first")
    parser.add_argument(
        "--db-name", help="database to create and seed (default: <DATABASE_URL name>_page_bench)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the seeded database and reuse it next time"
    )
    parser.add_argument(
        "--show-queries", action="store_true", help="print each page's SQL with its time"
    )
    args = parser.parse_args(argv)

    if connection.vendor != "postgresql":
        print("page_bench needs PostgreSQL: set DATABASE_URL=postgres://...", file=sys.stderr)
        return 2
    if args.scale <= 0 or args.iterations < 1 or args.warmup < 0:
        parser.error("--scale must be > 0, --iterations >= 1, --warmup >= 0")

    install_urlconf()
    # The test Client sends Host: testserver.
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    original = connection.settings_dict["NAME"]
    connection.settings_dict.setdefault("TEST", {})["NAME"] = (
        args.db_name or f"{original}_page_bench"
    )
    # Django reports dropping a leftover bench database on stderr before it recreates it;
    # that is the expected path here, not news.
    with contextlib.redirect_stderr(io.StringIO()):
        name = connection.creation.create_test_db(
            verbosity=0, autoclobber=True, serialize=False, keepdb=args.keep
        )
    try:
        try:
            seeded, reviewer = prepare(args.scale)
        except StaleBenchDatabase:
            connection.creation.destroy_test_db(original, verbosity=0)
            with contextlib.redirect_stderr(io.StringIO()):
                connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
            seeded, reviewer = prepare(args.scale)
        client = Client()
        client.force_login(reviewer)
        operator = Client()
        operator.force_login(operator_of(reviewer))
        try:
            # Finding the pages rendered each once: the process is now as warm as a served
            # worker after its first requests, and freezes its heap as a worker does.
            to_measure = pages(client)
            for page in to_measure:
                if page.as_operator:
                    operator.get(page.path)
            freeze_startup_heap()
            requesters = [
                Requester(operator if page.as_operator else client, page) for page in to_measure
            ]
            results = measure_all(requesters, args.iterations, args.warmup)
        except PageError as exc:
            print(f"page_bench: {exc}", file=sys.stderr)
            return 1
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            server = cursor.fetchone()[0]
        how = "reused" if seeded.reused else f"seeded in {seeded.seconds:.1f} s"
        print(
            f"page_bench: database {name} (PostgreSQL {server}), scale {args.scale:g}: "
            f"{seeded.occurrences:,} occurrences, {seeded.proposals:,} proposals, "
            f"{seeded.audit_events:,} audit events ({how}), two occurrences with "
            f"{seeded.long_history:,} events each"
        )
        print(
            f"{args.iterations} timed requests per page after {args.warmup} warm-up, the pages "
            "in turn; server time in-process (Django test Client), queries on one extra request"
        )
        print()
        print(table(results))
        if args.show_queries:
            for result in results:
                print(f"\n== {result.label}: {result.queries} queries")
                for query in result.sql:
                    print(f"{float(query['time']) * 1000:8.2f} ms  {query['sql']}")
        return 0
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(original, verbosity=0)


if __name__ == "__main__":
    sys.exit(main())
