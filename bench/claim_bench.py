"""How fast can approvals be claimed, and what does the guard cost?

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/console_bench \\
        .venv/bin/python bench/claim_bench.py [--claims 4000] [--procs 8] [--contenders 4]

Three arms, each on its own fresh approvals, each run by ``--procs`` forked processes
released together by a barrier. Every approval is claimed by ``--contenders`` processes
(with distinct execution ids), so each arm sees the same contention:

a. the physical limit: raw psycopg, one transaction of the claim's essential SQL
   (the conditional UPDATE of the approval, INSERT command, INSERT audit event);
b. the console's ``approvals.claims.claim.approval_claim``;
c. a naive Django claim: read the approval, check its state in Python, ``save()``.

It prints claims per second per arm, the ratio b/a, and the double claims per arm: claims
that got past the guard for an approval another claim also got past. It exits 1 if arm b
has any, or if any approval of a or b ends with other than one command.

Arm a is a bound, not a target. psycopg's own cursor (arm a) prepares
a statement after its fifth execution, while Django's cursors bind parameters client-side
and never prepare, so the server parses and plans every statement of arm b; and the service
runs the statements arm a leaves out (the contract read, the epoch, the occurrence status,
the read that names a refusal), each a round trip. ``--profile`` shows where arm b's time
goes in one process.

The database named by DATABASE_URL is created if missing and migrated; each run adds a
new tenant (``bench-<time>``) and leaves its rows behind (audit events are append-only),
so point it at a database of its own and drop that to clean up.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import multiprocessing
import pstats
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.django_setup import setup_django

# connection.queries must not grow for the length of a run.
setup_django(debug_off=True)

import psycopg
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import IntegrityError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.access import tokens
from approvals.access.runtime_keys import runtime_key_create
from approvals.access.tenancy import tenant_create
from approvals.audit.record import audit_record
from approvals.canonical.form import canonicalize
from approvals.claims.claim import approval_claim
from approvals.models import (
    Approval,
    Command,
    Epoch,
    Occurrence,
    Proposal,
    RuntimeKey,
    Tenant,
    ToolContract,
)
from approvals.vocabulary import ClaimDecision

TOOL = "issue_refund"
ARGUMENTS: dict[str, Any] = {
    "payment_id": "pay_bench",
    "amount_minor": 8000,
    "currency": "EUR",
    "reason": "Benchmark",
}
TIMEOUT = 600


@dataclass(frozen=True)
class Item:
    approval_id: int
    token: str


@dataclass(frozen=True)
class World:
    tenant: Tenant
    key: RuntimeKey
    contract: ToolContract
    approver_id: int


# --- the database ------------------------------------------------------------------------


def _pg_params(name: str | None = None) -> dict[str, Any]:
    db = settings.DATABASES["default"]
    params = {
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "dbname": name or db["NAME"],
    }
    return {k: v for k, v in params.items() if v is not None}


def prepare_database() -> str:
    """Create the database if it is missing, migrate it, and describe the server."""
    if connection.vendor != "postgresql":
        sys.exit("claim_bench: DATABASE_URL must point at PostgreSQL.")
    name = settings.DATABASES["default"]["NAME"]
    try:
        connection.ensure_connection()
    except Exception:
        with psycopg.connect(**_pg_params("postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    db = settings.DATABASES["default"]
    return f"PostgreSQL {version} at {db.get('HOST')}:{db.get('PORT')}/{name}"


def make_world() -> World:
    contract = ToolContract.objects.filter(name=TOOL).first()
    if contract is None:
        # A flushed test database loses the shipped contracts; put the one used back.
        from importlib import import_module

        migration = "approvals.migrations.0013_currency_quorum_and_identifier_patterns"
        shipped = import_module(migration).CONTRACTS
        (defaults,) = [c for c in shipped if c["name"] == TOOL]
        contract = ToolContract.objects.create(**defaults)
    tenant = tenant_create(slug=f"bench-{uuid.uuid4().hex[:12]}")
    key, _ = runtime_key_create(tenant=tenant, name="bench")
    approver = get_user_model().objects.create_user(username=f"{tenant.slug}-reviewer")
    return World(tenant=tenant, key=key, contract=contract, approver_id=approver.pk)


def make_approvals(world: World, count: int, *, with_epochs: bool = False) -> list[Item]:
    """``count`` issued approvals with delivered tokens, written in bulk.

    The review path (propose, approve, pick up) is not what is measured, so its rows are
    written directly. ``with_epochs`` pre-creates the epoch the raw arm's command needs.
    """
    action = canonicalize(TOOL, ARGUMENTS)
    now = timezone.now()
    raw_tokens = [tokens.mint(tokens.APPROVAL_TOKEN_PREFIX) for _ in range(count)]
    with transaction.atomic():
        occurrences = Occurrence.objects.bulk_create(
            Occurrence(
                tenant=world.tenant,
                runtime_key=world.key,
                tool=world.contract,
                run_id="bench",
                reason="bench",
                status=Occurrence.Status.APPROVED,
                decided_at=now,
            )
            for _ in range(count)
        )
        proposals = Proposal.objects.bulk_create(
            Proposal(
                occurrence=o,
                version=1,
                canonical_action=action.canonical,
                action_digest=action.digest,
            )
            for o in occurrences
        )
        approvals = Approval.objects.bulk_create(
            Approval(
                tenant=world.tenant,
                occurrence=o,
                proposal=p,
                approver_id=world.approver_id,
                tool_name=TOOL,
                action_digest=action.digest,
                proposal_version=1,
                token_hash=tokens.hash_secret(raw),
                fingerprint=tokens.fingerprint(raw),
                issued_at=now,
                expires_at=now + timedelta(hours=1),
                delivered_at=now,
            )
            for o, p, raw in zip(occurrences, proposals, raw_tokens, strict=True)
        )
        if with_epochs:
            Epoch.objects.bulk_create(
                Epoch(
                    occurrence=o,
                    number=1,
                    execution_id="bench",
                    justification=Epoch.Justification.APPROVAL,
                )
                for o in occurrences
            )
    return [Item(a.pk, raw) for a, raw in zip(approvals, raw_tokens, strict=True)]


# --- the arms: one claim each; the result says whether it got past the guard -------------

WON = "won"  # got past the guard and committed
STOPPED = "stopped_by_constraint"  # got past the guard; a unique constraint refused it


class RawClaimer:
    """Arm a: the claim's essential SQL through psycopg, nothing else."""

    UPDATE = """
        UPDATE approvals_approval
           SET state = 'consumed', consumed_at = CURRENT_TIMESTAMP, consumed_by_execution = %s
         WHERE tenant_id = %s AND token_hash = %s AND state = 'issued' AND action_digest = %s
           AND superseded_at IS NULL AND expires_at > CURRENT_TIMESTAMP
     RETURNING id, occurrence_id, fingerprint
    """
    COMMAND = """
        INSERT INTO approvals_command
               (id, tenant_id, occurrence_id, approval_id, epoch_id, execution_id,
                idempotency_key, action_digest, state, executed_by, created_at, updated_at)
        VALUES (%s, %s, %s, %s,
                (SELECT id FROM approvals_epoch WHERE occurrence_id = %s AND number = 1),
                %s, %s, %s, 'pending', 'console', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)
    """
    AUDIT = """
        INSERT INTO approvals_auditevent
               (event_id, kind, tenant_id, occurrence_id, actor, token_fingerprint, decision,
                reason_code, execution_id, message_id, command_id, trace_id, source_time,
                ingested_at, data)
        VALUES (%s, %s, %s, %s, 'runtime', %s, %s, %s, %s, '', %s, '', CURRENT_TIMESTAMP,
                CURRENT_TIMESTAMP, '{}')
    """

    def __init__(self, tenant_id: int) -> None:
        self.tenant_id = tenant_id
        self.conn = psycopg.connect(**_pg_params())

    def __call__(self, item: Item, execution_id: str) -> str:
        digest = canonicalize(TOOL, ARGUMENTS).digest
        token_hash = tokens.hash_secret(item.token)
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.execute(self.UPDATE, (execution_id, self.tenant_id, token_hash, digest))
            row = cur.fetchone()
            if row is None:
                cur.execute(
                    self.AUDIT,
                    (uuid.uuid4(), "claim.replayed", self.tenant_id, None, "", "replayed",
                     "refused", execution_id, None),
                )  # fmt: skip
                return "refused"
            approval_id, occurrence_id, fingerprint = row
            command_id = uuid.uuid4()
            cur.execute(
                self.COMMAND,
                (command_id, self.tenant_id, occurrence_id, approval_id, occurrence_id,
                 execution_id, f"cmd_{command_id.hex}", digest),
            )  # fmt: skip
            cur.execute(
                self.AUDIT,
                (uuid.uuid4(), "claim.approved", self.tenant_id, occurrence_id, fingerprint,
                 "approved", "claimed", execution_id, command_id),
            )  # fmt: skip
        return WON

    def close(self) -> None:
        self.conn.close()


class ServiceClaimer:
    """Arm b: the console's claim service."""

    def __init__(self, tenant_id: int) -> None:
        self.tenant = Tenant.objects.get(pk=tenant_id)

    def __call__(self, item: Item, execution_id: str) -> str:
        result = approval_claim(
            tenant=self.tenant,
            token=item.token,
            tool=TOOL,
            arguments=ARGUMENTS,
            execution_id=execution_id,
        )
        return WON if result.decision == ClaimDecision.APPROVED else result.decision

    def close(self) -> None:
        connections.close_all()


class NaiveClaimer(ServiceClaimer):
    """Arm c: the bug this project exists to prevent. It reads the approval, decides in
    Python, then saves: two processes can both read ``issued`` before either saves."""

    def __call__(self, item: Item, execution_id: str) -> str:
        action = canonicalize(TOOL, ARGUMENTS)
        passed = False
        try:
            with transaction.atomic():
                approval = Approval.objects.get(
                    tenant=self.tenant, token_hash=tokens.hash_secret(item.token)
                )
                now = timezone.now()
                if (
                    approval.state != Approval.State.ISSUED
                    or approval.action_digest != action.digest
                    or approval.superseded_at is not None
                    or approval.expires_at <= now
                ):
                    audit_record(
                        kind="claim.replayed",
                        tenant=self.tenant,
                        occurrence=approval.occurrence_id,
                        decision="replayed",
                        execution_id=execution_id,
                    )
                    return "refused"
                passed = True
                approval.state = Approval.State.CONSUMED
                approval.consumed_at = now
                approval.consumed_by_execution = execution_id
                approval.save()
                epoch = Epoch.objects.create(
                    occurrence_id=approval.occurrence_id,
                    number=Epoch.objects.filter(occurrence_id=approval.occurrence_id).count() + 1,
                    execution_id=execution_id,
                    justification=Epoch.Justification.APPROVAL,
                )
                command_id = uuid.uuid4()
                Command.objects.create(
                    id=command_id,
                    tenant=self.tenant,
                    occurrence_id=approval.occurrence_id,
                    approval=approval,
                    epoch=epoch,
                    execution_id=execution_id,
                    idempotency_key=f"cmd_{command_id.hex}",
                    action_digest=action.digest,
                )
                audit_record(
                    kind="claim.approved",
                    tenant=self.tenant,
                    occurrence=approval.occurrence_id,
                    decision="approved",
                    execution_id=execution_id,
                    command_id=command_id,
                )
        except IntegrityError:
            if passed:
                return STOPPED
            raise
        return WON


ARMS: dict[str, tuple[str, Callable[[int], Any]]] = {
    "a": ("raw psycopg (the limit)", RawClaimer),
    "b": ("approval_claim service", ServiceClaimer),
    "c": ("naive select-then-save", NaiveClaimer),
}


# --- running an arm ------------------------------------------------------------------------


@dataclass
class ArmResult:
    name: str
    claims: int
    approvals: int
    seconds: float
    outcomes: Counter[str] = field(default_factory=Counter)
    double_claims: int = 0
    errors: list[str] = field(default_factory=list)
    bad_command_counts: int = 0

    @property
    def per_second(self) -> float:
        return self.claims / self.seconds


def _worker(
    arm: str,
    tenant_id: int,
    worker: int,
    items: list[Item],
    barrier: Any,
    results: Any,
) -> None:
    outcomes: list[tuple[int, str]] = []
    try:
        claimer = ARMS[arm][1](tenant_id)
        if arm != "a":
            connection.ensure_connection()  # connecting is not part of the measurement
        barrier.wait(timeout=TIMEOUT)
        for item in items:
            try:
                outcome = claimer(item, f"{arm}-w{worker}-{item.approval_id}")
            except Exception as exc:
                outcome = f"error: {type(exc).__name__}: {exc}"
            outcomes.append((item.approval_id, outcome))
        claimer.close()
    finally:
        results.put(outcomes)
        connections.close_all()


def _teams(items: list[Item], procs: int, contenders: int) -> Iterator[list[Item]]:
    """Each process's work list: the processes of one team walk the same approvals."""
    teams = max(1, procs // contenders)
    for worker in range(procs):
        yield items[worker % teams :: teams]


def run_arm(arm: str, world: World, claims: int, procs: int, contenders: int) -> ArmResult:
    contenders = min(contenders, procs)
    teams = max(1, procs // contenders)
    approvals = max(teams, claims // contenders)
    items = make_approvals(world, approvals, with_epochs=arm == "a")

    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(procs + 1)
    queue = ctx.Queue()
    connections.close_all()  # the children must not share this process's connection
    workers = [
        ctx.Process(
            target=_worker, args=(arm, world.tenant.pk, i, work, barrier, queue), daemon=True
        )
        for i, work in enumerate(_teams(items, procs, contenders))
    ]
    for process in workers:
        process.start()
    barrier.wait(timeout=TIMEOUT)
    started = time.perf_counter()
    per_worker = [queue.get(timeout=TIMEOUT) for _ in workers]
    seconds = time.perf_counter() - started
    for process in workers:
        process.join(timeout=TIMEOUT)

    result = ArmResult(
        name=ARMS[arm][0], claims=sum(map(len, per_worker)), approvals=approvals, seconds=seconds
    )
    passed: Counter[int] = Counter()
    for outcomes in per_worker:
        for approval_id, outcome in outcomes:
            if outcome.startswith("error"):
                result.errors.append(outcome)
                outcome = "error"
            result.outcomes[outcome] += 1
            if outcome in (WON, STOPPED):
                passed[approval_id] += 1
    result.double_claims = sum(n - 1 for n in passed.values() if n > 1)
    ids = [item.approval_id for item in items]
    commands = Counter(
        Command.objects.filter(approval_id__in=ids).values_list("approval_id", flat=True)
    )
    result.bad_command_counts = sum(1 for pk in ids if commands[pk] != 1)
    return result


# --- profile: what one claim costs ----------------------------------------------------------


def count_queries(world: World) -> dict[str, int]:
    """Round trips per decision of the service, BEGIN and COMMIT included."""
    claim = ServiceClaimer(world.tenant.pk)
    item, other = make_approvals(world, 2)
    counts = {}
    for label, target, execution_id in [
        ("approved", item, "profile-1"),
        ("duplicate_delivery", item, "profile-1"),
        ("replayed", item, "profile-2"),
    ]:
        with CaptureQueriesContext(connection) as queries:
            assert claim(target, execution_id) in (WON, label)
        counts[label] = len(queries.captured_queries)
    with CaptureQueriesContext(connection) as queries:
        claim(Item(other.approval_id, "apv_unknown"), "profile-3")
    counts["unknown_token"] = len(queries.captured_queries)
    return counts


def profile_service(world: World, claims: int, contenders: int) -> None:
    """Arm b's claims one after another in this process under cProfile: the same mix of
    decisions as a run (each approval claimed by ``contenders`` executions), without the
    concurrency, so that the functions the time goes to can be read off."""
    claim = ServiceClaimer(world.tenant.pk)
    items = make_approvals(world, max(1, claims // contenders))
    connection.ensure_connection()
    profiler = cProfile.Profile()
    started, cpu = time.perf_counter(), time.process_time()
    profiler.enable()
    for item in items:
        for n in range(contenders):
            claim(item, f"profile-{n}-{item.approval_id}")
    profiler.disable()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    done = len(items) * contenders
    print(
        f"{done} claims in one process, profiled: {seconds / done * 1e6:.0f} µs each, "
        f"{cpu / done * 1e6:.0f} µs of it this process's CPU (the rest: waiting on the database)\n"
    )
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)


# --- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=4000, help="claim calls per arm and run")
    parser.add_argument("--procs", type=int, default=8, help="processes per arm")
    parser.add_argument(
        "--contenders", type=int, default=4, help="processes claiming each approval"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each arm, interleaved; the best counts"
    )
    parser.add_argument("--arms", default="abc", help="which arms to run, e.g. ab")
    parser.add_argument(
        "--log", action="store_true", help="keep the service's INFO log lines (slower)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of the arms, profile arm b's claims in one process (cProfile)",
    )
    args = parser.parse_args(argv)
    if not args.log:
        logging.getLogger("approvals").setLevel(logging.WARNING)

    server = prepare_database()
    world = make_world()
    contenders = min(args.contenders, args.procs)
    print(
        f"claim bench: {args.claims} claims per arm and run, {args.procs} processes, "
        f"{contenders} per approval, best of {args.repeat}; {server}"
    )
    if args.profile:
        profile_service(world, args.claims, contenders)
        return 0
    profile = count_queries(world)
    print(
        "round trips per claim, BEGIN and COMMIT included: a approved 5, refused 4; b "
        + ", ".join(f"{k} {v}" for k, v in profile.items())
    )
    print()

    runs: dict[str, list[ArmResult]] = {arm: [] for arm in args.arms}
    for _ in range(args.repeat):
        # Interleaved, so that a noisy neighbour slows every arm rather than one.
        for arm in args.arms:
            runs[arm].append(run_arm(arm, world, args.claims, args.procs, contenders))
    best = {arm: max(results, key=lambda r: r.per_second) for arm, results in runs.items()}

    print(f"{'arm':<30} {'claims/s':>9} {'double claims':>14}  outcomes (all runs)")
    for arm, results in runs.items():
        outcomes = sum((r.outcomes for r in results), Counter())
        doubles = sum(r.double_claims for r in results)
        print(
            f"{arm}  {best[arm].name:<27} {best[arm].per_second:>9.0f} {doubles:>14}  "
            + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        )
    if "a" in best and "b" in best:
        print(f"\nratio b/a: {best['b'].per_second / best['a'].per_second:.2f}")
    naive_doubles = sum(r.double_claims for r in runs.get("c", []))
    if naive_doubles:
        print(
            f"arm c: {naive_doubles} claims got past the Python check for an approval that "
            "another claim had passed too; only the unique constraint on Command.approval "
            "kept them from becoming second commands."
        )

    failed = False
    for arm in "ab":
        for r in runs.get(arm, []):
            for problem, count in [
                ("double claims", r.double_claims),
                ("errors", len(r.errors)),
                ("approvals without exactly one command", r.bad_command_counts),
            ]:
                if count:
                    failed = True
                    print(f"FAIL arm {arm}: {count} {problem}", file=sys.stderr)
            for error in r.errors[:5]:
                print(f"  {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
