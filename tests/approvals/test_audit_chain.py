"""Tamper evidence: the per-tenant hash chain, the trigger that keeps the trail
append-only, and ``verify_audit_chain`` naming the first edited, deleted or inserted event."""

from __future__ import annotations

import hashlib
import io
import itertools
import multiprocessing
import uuid
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing.synchronize import Barrier
from typing import Any

import pytest
import rfc8785
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from approvals import tasks
from approvals.audit import chain as audit_chain
from approvals.audit.chain import audit_chain_extend, audit_chain_verify
from approvals.audit.record import audit_record
from approvals.models import (
    AUDIT_CHAIN_GENESIS,
    AuditChainHead,
    AuditEvent,
    Tenant,
    chain_canonical,
)
from tests.conftest import Runtime

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the append-only trigger is PostgreSQL's"
)


def _record(tenant: Tenant, n: int = 1, **fields: Any) -> list[AuditEvent]:
    return [
        audit_record(kind=fields.pop("kind", "test.event"), tenant=tenant, **fields)
        for _ in range(n)
    ]


def _chain(tenant: Tenant) -> list[AuditEvent]:
    audit_chain_extend(tenant_id=tenant.pk)
    return list(AuditEvent.objects.filter(tenant=tenant).order_by("chain_seq"))


def _verify(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit_chain", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _lift_trigger() -> None:
    """What someone with the database's owner rights could do; inside the test's
    transaction, so it is rolled back with it."""
    with connection.cursor() as cursor:
        # The deferred foreign-key checks of the rows written so far first: PostgreSQL
        # alters no table with trigger events pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            "ALTER TABLE approvals_auditevent DISABLE TRIGGER approvals_auditevent_append_only"
        )


# --- the chain -------------------------------------------------------------------------


def test_events_are_chained_per_tenant_in_id_order(
    runtime: Runtime, other_runtime: Runtime
) -> None:
    mine, theirs = runtime.key.tenant, other_runtime.key.tenant
    _record(mine, 2)
    _record(theirs, 1)
    _record(mine, 1)

    chain = _chain(mine)

    assert [e.chain_seq for e in chain] == [1, 2, 3]
    assert [e.pk for e in chain] == sorted(e.pk for e in chain)
    assert chain[0].prev_hash == AUDIT_CHAIN_GENESIS
    for before, after in itertools.pairwise(chain):
        assert after.prev_hash == before.hash
    for event in chain:
        form = event.chain_form(chain_seq=event.chain_seq or 0, prev_hash=event.prev_hash or "")
        assert event.hash == hashlib.sha256(rfc8785.dumps(form)).hexdigest()
    assert AuditEvent.objects.get(tenant=theirs).chain_seq is None
    head = AuditChainHead.objects.get(tenant=mine)
    assert (head.seq, head.hash) == (3, chain[-1].hash)


def test_extending_again_continues_the_chain(runtime: Runtime) -> None:
    tenant = runtime.key.tenant
    _record(tenant, 2)
    first = _chain(tenant)
    _record(tenant, 2)

    chain = _chain(tenant)

    assert [e.chain_seq for e in chain] == [1, 2, 3, 4]
    assert [e.hash for e in chain[:2]] == [e.hash for e in first]
    assert chain[2].prev_hash == chain[1].hash


def test_extension_in_small_batches_makes_the_same_chain(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_chain, "AUDIT_CHAIN_BATCH", 3)
    tenant = runtime.key.tenant
    _record(tenant, 8)

    through = audit_chain_extend(tenant_id=tenant.pk, limit=5)

    assert AuditEvent.objects.filter(chain_seq__isnull=False).count() == 5
    assert through == AuditEvent.objects.get(chain_seq=5).pk
    chain = _chain(tenant)
    assert [e.chain_seq for e in chain] == list(range(1, 9))
    assert _verify("--tenant", tenant.slug)[0] == 0


def test_the_hash_covers_every_field_and_the_link(runtime: Runtime) -> None:
    [event] = _record(runtime.key.tenant)
    base = event.chain_hash(chain_seq=1, prev_hash=AUDIT_CHAIN_GENESIS)

    assert event.chain_hash(chain_seq=2, prev_hash=AUDIT_CHAIN_GENESIS) != base
    assert event.chain_hash(chain_seq=1, prev_hash="1" * 64) != base
    for name, value in [
        ("kind", "other"),
        ("actor", "mallory"),
        ("decision", "approved"),
        ("data", {"x": 1}),
        ("source_time", event.source_time + timedelta(microseconds=1)),
        ("ingested_at", event.ingested_at - timedelta(seconds=1)),
        ("event_id", uuid.uuid4()),
        ("id", event.pk + 1),
    ]:
        changed = AuditEvent.objects.get(pk=event.pk)
        setattr(changed, name, value)
        assert changed.chain_hash(chain_seq=1, prev_hash=AUDIT_CHAIN_GENESIS) != base, name


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children),
    max_leaves=8,
)


@given(
    text=st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    number=st.integers(-(2**53) + 1, 2**53 - 1),
    data=st.dictionaries(st.text(), _json, max_size=4),
)
def test_the_fast_canonical_form_is_rfc_8785(text: str, number: int, data: Any) -> None:
    form = {
        "actor": text,
        "chain_seq": number,
        "command_id": None,
        "data": data,
        "kind": text[::-1],
        "prev_hash": "0" * 64,
    }

    assert chain_canonical(form) == rfc8785.dumps(form)


def test_a_number_json_cannot_carry_still_gets_a_stable_hash(runtime: Runtime) -> None:
    [event] = _record(runtime.key.tenant, data={"big": 2**60})
    event.refresh_from_db()

    digest = event.chain_hash(chain_seq=1, prev_hash=AUDIT_CHAIN_GENESIS)

    assert digest == event.chain_hash(chain_seq=1, prev_hash=AUDIT_CHAIN_GENESIS)
    assert _chain(runtime.key.tenant)[0].hash == digest


def test_the_beat_task_chains_every_tenant(runtime: Runtime, other_runtime: Runtime) -> None:
    _record(runtime.key.tenant, 2)
    _record(other_runtime.key.tenant, 1)

    assert tasks.audit_chain_extend_all() == 2

    assert not AuditEvent.objects.filter(chain_seq__isnull=True).exists()
    assert tasks.audit_chain_extend_all() == 0


@on_postgresql
def test_a_tenant_whose_chain_is_in_the_way_does_not_stop_the_others(
    runtime: Runtime, other_runtime: Runtime
) -> None:
    [forged] = _record(runtime.key.tenant)
    _record(runtime.key.tenant)
    with connection.cursor() as cursor:
        # A chain_seq set behind the chain's back: the next one given out collides.
        cursor.execute(
            "UPDATE approvals_auditevent SET chain_seq = 1, hash = 'x', prev_hash = 'y'"
            " WHERE id = %s",
            [forged.pk],
        )
    [theirs] = _record(other_runtime.key.tenant)

    tasks.audit_chain_extend_all()

    assert AuditEvent.objects.get(pk=theirs.pk).chain_seq == 1
    assert _verify("--tenant", "acme")[0] == 1


def test_the_beat_schedule_runs_the_chain_every_few_seconds() -> None:
    entry = next(
        e
        for e in settings.CELERY_BEAT_SCHEDULE.values()
        if e["task"] == "approvals.tasks.audit_chain_extend_all"
    )
    assert float(entry["schedule"]) <= 10  # type: ignore[arg-type]


def test_writing_an_event_does_not_chain_it(
    runtime: Runtime, django_assert_num_queries: Any
) -> None:
    # The claim's hot path: one INSERT, nothing of the chain.
    with django_assert_num_queries(1):
        event = audit_record(kind="test.event", tenant=runtime.key.tenant)

    assert event.chain_seq is None


# --- the append-only trigger -------------------------------------------------------------


@on_postgresql
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE approvals_auditevent SET kind = 'forged' WHERE id = %s",
        "DELETE FROM approvals_auditevent WHERE id = %s",
        # Setting the chain columns together with anything else.
        "UPDATE approvals_auditevent SET chain_seq = 9, hash = 'x', prev_hash = 'y',"
        " decision = 'approved' WHERE id = %s",
    ],
)
def test_the_trigger_refuses_updates_and_deletes_of_an_unchained_event(
    runtime: Runtime, sql: str
) -> None:
    [event] = _record(runtime.key.tenant)

    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [event.pk])

    assert AuditEvent.objects.get(pk=event.pk).kind == "test.event"


@on_postgresql
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE approvals_auditevent SET kind = 'forged' WHERE id = %s",
        "DELETE FROM approvals_auditevent WHERE id = %s",
        "UPDATE approvals_auditevent SET chain_seq = 9, hash = 'x', prev_hash = 'y' WHERE id = %s",
        "UPDATE approvals_auditevent SET chain_seq = NULL, hash = NULL, prev_hash = NULL"
        " WHERE id = %s",
    ],
)
def test_the_trigger_refuses_every_change_to_a_chained_event(runtime: Runtime, sql: str) -> None:
    [event] = _record(runtime.key.tenant)
    [chained] = _chain(runtime.key.tenant)

    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [event.pk])

    assert AuditEvent.objects.get(pk=event.pk).hash == chained.hash


@on_postgresql
def test_the_trigger_allows_setting_the_chain_columns_once(runtime: Runtime) -> None:
    [event] = _record(runtime.key.tenant)

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE approvals_auditevent SET chain_seq = 1, hash = 'h', prev_hash = 'p'"
            " WHERE id = %s",
            [event.pk],
        )

    assert AuditEvent.objects.get(pk=event.pk).chain_seq == 1


@on_postgresql
def test_ingestions_and_duplicate_deliveries_are_append_only(runtime: Runtime) -> None:
    from approvals.models import AuditIngestion

    ingestion = AuditIngestion.objects.create(
        tenant=runtime.key.tenant, received=0, new=0, duplicates=0
    )

    for sql in [
        "UPDATE approvals_auditingestion SET new = 5 WHERE id = %s",
        "DELETE FROM approvals_auditingestion WHERE id = %s",
    ]:
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [ingestion.pk])


# --- verify_audit_chain --------------------------------------------------------------------


@pytest.fixture
def chained(runtime: Runtime, other_runtime: Runtime) -> list[AuditEvent]:
    """Five chained events of the runtime's tenant (and two of another tenant)."""
    _record(other_runtime.key.tenant, 2)
    _record(runtime.key.tenant, 5)
    _chain(other_runtime.key.tenant)
    return _chain(runtime.key.tenant)


def test_an_intact_chain_verifies_with_a_line_per_tenant(chained: list[AuditEvent]) -> None:
    code, out, err = _verify()

    assert code == 0, err
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("acme: ok, 5 events chained (chain_seq 1 to 5), head ")
    assert lines[1].startswith("globex: ok, 2 events chained")
    assert len(lines) == 2


def test_verify_chains_what_is_new_first(runtime: Runtime) -> None:
    _record(runtime.key.tenant, 3)

    code, out, _ = _verify("--tenant", "acme")

    assert code == 0
    assert out.startswith("acme: ok, 3 events chained")


def test_a_tenant_without_events_verifies(tenant: Tenant) -> None:
    assert _verify("--tenant", "acme") == (0, "acme: ok, no events chained\n", "")


def test_an_unknown_tenant_is_an_error(db: Any) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No tenant"):
        call_command("verify_audit_chain", "--tenant", "nobody")


@on_postgresql
def test_an_edited_event_is_named(chained: list[AuditEvent]) -> None:
    _lift_trigger()
    edited = chained[2]
    AuditEvent.objects.filter(pk=edited.pk).update(decision="approved")

    code, _, err = _verify("--tenant", "acme")

    assert code == 1
    assert f"acme: EDITED: event #{edited.pk} (test.event" in err
    assert "chain_seq 3" in err


@on_postgresql
def test_an_event_edited_and_rehashed_is_named_by_the_next_link(
    chained: list[AuditEvent],
) -> None:
    _lift_trigger()
    edited = AuditEvent.objects.get(pk=chained[1].pk)
    edited.decision = "approved"
    rehashed = edited.chain_hash(chain_seq=2, prev_hash=edited.prev_hash or "")
    AuditEvent.objects.filter(pk=edited.pk).update(decision="approved", hash=rehashed)

    code, _, err = _verify("--tenant", "acme")

    assert code == 1
    assert "INSERTED" in err
    assert f"does not follow event #{edited.pk}" in err


@on_postgresql
def test_a_deleted_event_is_named(chained: list[AuditEvent]) -> None:
    _lift_trigger()
    AuditEvent.objects.filter(pk=chained[1].pk).delete()

    code, _, err = _verify("--tenant", "acme")

    assert code == 1
    assert "acme: DELETED: chain_seq 2 missing" in err
    assert f"between event #{chained[0].pk} and event #{chained[2].pk}" in err


@on_postgresql
def test_the_newest_events_deleted_are_found_by_the_head(chained: list[AuditEvent]) -> None:
    _lift_trigger()
    AuditEvent.objects.filter(pk__in=[chained[3].pk, chained[4].pk]).delete()

    code, _, err = _verify("--tenant", "acme")

    assert code == 1
    assert "acme: DELETED: the chain ends at chain_seq 3" in err
    assert "records chain_seq 5" in err


def test_a_deleted_chain_head_is_found(chained: list[AuditEvent]) -> None:
    AuditChainHead.objects.filter(tenant=chained[0].tenant).delete()

    report = audit_chain_verify(tenant=chained[0].tenant)

    assert report.problem is not None
    assert report.problem.kind == "deleted"
    assert "head" in report.problem.message


def test_extending_with_no_room_chains_nothing(runtime: Runtime) -> None:
    _record(runtime.key.tenant, 2)

    assert audit_chain_extend(tenant_id=runtime.key.tenant.pk, limit=0) == 0
    assert not AuditEvent.objects.filter(chain_seq__isnull=False).exists()


@on_postgresql
def test_an_event_inserted_with_an_old_id_is_named(runtime: Runtime) -> None:
    # No trigger to lift: an INSERT is allowed. A free id below the chain's end:
    tenant = runtime.key.tenant
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence('approvals_auditevent', 'id'))")
        (free_id,) = cursor.fetchone()
    _record(tenant, 3)
    _chain(tenant)
    forged = AuditEvent.objects.create(
        id=free_id, tenant=tenant, kind="claim.approved", source_time=timezone.now()
    )

    code, _, err = _verify("--tenant", "acme")

    assert code == 1
    assert f"acme: INSERTED: event #{forged.pk} (claim.approved" in err
    assert "inserted afterwards with an old id" in err


@on_postgresql
def test_an_event_inserted_into_the_chain_is_named(chained: list[AuditEvent]) -> None:
    # Forged in place of the third: right chain_seq, right prev_hash, its own right hash.
    _lift_trigger()
    third = chained[2]
    AuditEvent.objects.filter(pk=third.pk).delete()
    forged = AuditEvent(
        tenant_id=third.tenant_id,
        kind="claim.approved",
        source_time=third.source_time,
        ingested_at=third.ingested_at,
    )
    forged.save()
    forged.refresh_from_db()
    digest = forged.chain_hash(chain_seq=3, prev_hash=chained[1].hash or "")
    AuditEvent.objects.filter(pk=forged.pk).update(
        chain_seq=3, prev_hash=chained[1].hash, hash=digest
    )

    code, _, err = _verify("--tenant", "acme")

    assert code == 1
    assert "acme: INSERTED:" in err
    assert f"does not follow event #{forged.pk}" in err


def test_an_event_left_unchained_is_reported_after_a_minute(chained: list[AuditEvent]) -> None:
    tenant = chained[0].tenant
    [late] = _record(tenant)
    # As if the chain extension had not run since it was written.
    report = audit_chain_verify(tenant=tenant, now=timezone.now() + timedelta(minutes=2))
    fresh = audit_chain_verify(tenant=tenant)

    assert report.problem is not None
    assert report.problem.kind == "unchained"
    assert report.problem.event_pk == late.pk
    assert fresh.ok
    assert fresh.unchained == 1


# --- concurrent writers never fork the chain ------------------------------------------------

WRITERS = 6
EVENTS_PER_WRITER = 15
TIMEOUT = 60


def _writer(tenant_id: int, barrier: Barrier, errors: Any) -> None:
    try:
        barrier.wait(timeout=TIMEOUT)
        for n in range(EVENTS_PER_WRITER):
            with transaction.atomic():
                audit_record(kind="race.write", tenant=tenant_id, data={"n": n})
                if n % 3 == 0:
                    # Some events from transactions that also write something else first.
                    audit_record(kind="race.second", tenant=tenant_id)
            audit_chain_extend(tenant_id=tenant_id)
    except Exception as exc:  # reported to the parent, which fails the test
        errors.put(f"{type(exc).__name__}: {exc}")
    finally:
        connections.close_all()


@pytest.fixture
def forked(transactional_db: Any) -> Iterator[Any]:
    yield multiprocessing.get_context("fork")


@pytest.mark.race
@pytest.mark.slow
@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_and_extenders_never_fork_the_chain(
    forked: Any, runtime: Runtime
) -> None:
    tenant = runtime.key.tenant
    # The children must not share the parent's socket: each opens its own connection.
    connections.close_all()
    barrier = forked.Barrier(WRITERS)
    errors = forked.Queue()
    processes = [
        forked.Process(target=_writer, args=(tenant.pk, barrier, errors), daemon=True)
        for _ in range(WRITERS)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=TIMEOUT)
        assert process.exitcode == 0
    assert errors.empty(), errors.get()

    chain = _chain(tenant)

    expected = WRITERS * (EVENTS_PER_WRITER + len(range(0, EVENTS_PER_WRITER, 3)))
    assert len(chain) == expected
    assert [e.chain_seq for e in chain] == list(range(1, expected + 1))
    assert [e.pk for e in chain] == sorted(e.pk for e in chain)
    assert chain[0].prev_hash == AUDIT_CHAIN_GENESIS
    for before, after in itertools.pairwise(chain):
        assert after.prev_hash == before.hash
    assert _verify("--tenant", tenant.slug)[0] == 0
