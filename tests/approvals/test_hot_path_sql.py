"""Issue 28: the hot calls' reads written as SQL on PostgreSQL (the contract, the run's
earlier rejections, the claim's proposer, the occurrence an API read shows) answer as their
ORM twins, which SQLite runs: the same rows, in the same order, for the cases that tell
them apart. The routing rule's subquery runs on both databases: it is run on both here and
held to the rule written as a queryset (``routing_oracle``)."""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any

import pytest
from django.db import connection
from django.db.models import Case, F, IntegerField, Q, QuerySet, Value, When
from django.forms.models import model_to_dict

from approvals.access import tokens
from approvals.access.runtime_keys import (
    _PROPOSER_SQL,
    claimed_by_other_key,
    proposer_of_token,
)
from approvals.api.occurrences import _occurrence_out
from approvals.models import Occurrence, RoutingRuleVersion, RuntimeKey, Tenant, ToolContract
from approvals.reviews.decisions import occurrence_reject
from approvals.reviews.proposals import prior_rejections, prior_rejections_queryset
from approvals.reviews.selectors import (
    occurrence_detail_queryset,
    occurrence_get_for_tenant,
    tool_contract,
)
from approvals.routing.changes import reviewer_group_save, routing_rule_save
from approvals.routing.rules import request_money, routing_version
from tests.conftest import REFUND_ARGS, Runtime, approve, make_runtime

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the SQL is PostgreSQL's; SQLite runs the twins"
)


@pytest.mark.django_db
def test_the_contract_read_answers_as_its_orm_twin() -> None:
    for name in ToolContract.objects.values_list("name", flat=True):
        contract = tool_contract(name)
        twin = ToolContract.objects.filter(name=name).first()
        assert contract is not None and twin is not None
        assert model_to_dict(contract) == model_to_dict(twin)
        assert contract.pk == twin.pk and contract.version == twin.version
    assert tool_contract("no_such_tool") is None


def test_the_prior_rejections_answer_as_their_orm_twin(
    runtime: Runtime, tenant: Tenant, reviewer: Any
) -> None:
    run_id = "run-twin"
    ids = []
    for i, amount in enumerate([1000, 1000, 1000, 2000]):
        answer = runtime.propose(
            "issue_refund",
            {**REFUND_ARGS, "amount_minor": amount},
            run_id=run_id,
            client_ref=f"twin-{i}",
        )
        ids.append(answer.json()["occurrence_id"])
    for occurrence_id in ids[:2] + ids[3:]:
        occurrence_reject(
            occurrence=Occurrence.objects.get(pk=occurrence_id), reviewer=reviewer, reason="no"
        )
    Occurrence.objects.filter(pk=ids[2]).update(status=Occurrence.Status.TIMED_OUT)
    digests = {
        p.action_digest
        for o in Occurrence.objects.filter(pk__in=ids).prefetch_related("proposals")
        for p in o.proposals.all()
    }
    assert len(digests) == 2
    for digest in digests:
        for with_timeouts in (False, True):
            for exclude in (None, uuid.UUID(ids[0])):
                for limit in (1, 20):
                    statuses = ["rejected", *(["timed_out"] if with_timeouts else [])]
                    twin = list(
                        prior_rejections_queryset(
                            tenant_id=tenant.pk,
                            run_id=run_id,
                            action_digest=digest,
                            statuses=statuses,
                            exclude=exclude,
                        )[:limit]
                    )
                    found = prior_rejections(
                        tenant=tenant,
                        run_id=run_id,
                        action_digest=digest,
                        exclude=exclude,
                        limit=limit,
                        with_timeouts=with_timeouts,
                    )
                    assert [
                        (p.occurrence_id, p.decided_at, p.decided_by or None) for p in found
                    ] == [(r["pk"], r["decided_at"], r["decided_by"]) for r in twin]
    assert prior_rejections(tenant=tenant, run_id="another run", action_digest=digest) == []


def routing_oracle(*, tenant_id: int, contract: ToolContract, arguments: Any) -> QuerySet[Any]:
    """The routing rule as a queryset, the versions that may route the request in order:
    ``routing_version``'s reference. Not in approvals/: the SQL runs on PostgreSQL and
    SQLite alike, so nothing there runs this (unlike the other twins, SQLite's)."""
    match = Q(currency="")
    money = request_money(contract, arguments)
    if money is not None:
        amount, currency = money
        match |= (
            Q(currency=currency)
            & (Q(amount_over_minor__isnull=True) | Q(amount_over_minor__lt=amount))
            & (Q(amount_up_to_minor__isnull=True) | Q(amount_up_to_minor__gte=amount))
        )
    return (
        RoutingRuleVersion.objects.filter(
            tenant_id=tenant_id, tool_id=contract.pk, is_current=True, is_active=True
        )
        .filter(match)
        .annotate(
            unbanded=Case(
                When(currency="", then=Value(1)), default=Value(0), output_field=IntegerField()
            )
        )
        .order_by("unbanded", F("amount_over_minor").desc(nulls_last=True), "rule_id")
    )


_VERSION_COLUMNS = (
    "id",
    "is_active",
    "is_current",
    "tenant_id",
    "tool_id",
    "currency",
    "amount_over_minor",
    "amount_up_to_minor",
    "rule_id",
)


def on_sqlite(raw: Any) -> int | None:
    """``raw``'s text run by SQLite (what the demo runs) on a copy of the versions' rows."""
    lite = sqlite3.connect(":memory:")
    table = RoutingRuleVersion._meta.db_table
    lite.execute(f"CREATE TABLE {table} ({', '.join(_VERSION_COLUMNS)})")
    rows = RoutingRuleVersion.objects.values_list(*_VERSION_COLUMNS)
    lite.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * 9)})", rows)
    found = lite.execute(f"SELECT ({raw.sql.replace('%s', '?')})", raw.params).fetchone()[0]
    lite.close()
    return found if found is None else int(found)


def test_the_routing_subquery_picks_as_the_rule_on_both_databases(
    tenant: Tenant, admin_user: Any, reviewer: Any
) -> None:
    group = reviewer_group_save(
        tenant=tenant, admin=admin_user, name="support", member_ids=[reviewer.pk]
    ).group
    contract = ToolContract.objects.get(name="issue_refund")

    def picked(arguments: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
        raw = routing_version(tenant_id=tenant.pk, contract=contract, arguments=arguments)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT ({raw.sql})", raw.params)
            chosen = cursor.fetchone()[0]
        oracle = routing_oracle(tenant_id=tenant.pk, contract=contract, arguments=arguments)
        return chosen, on_sqlite(raw), oracle.values_list("pk", flat=True).first()

    amounts = [0, 1000, 50000, 50001, 99999, 100000, 100001, 10**12]
    cases = [{**REFUND_ARGS, "amount_minor": a} for a in amounts]
    cases += [{**REFUND_ARGS, "currency": "USD", "amount_minor": 70000}, {"order_id": "x"}]
    assert {picked(c) for c in cases} == {(None, None, None)}
    bands = [("", None, None), ("EUR", 50000, None), ("EUR", None, 100000), ("EUR", 50000, 100000)]
    for i, (currency, over, up_to) in enumerate(bands):
        routing_rule_save(
            tenant=tenant,
            admin=admin_user,
            tool="issue_refund",
            name=f"rule {i}",
            group_ids=[group.pk],
            currency=currency,
            amount_over_minor=over,
            amount_up_to_minor=up_to,
        )
        for arguments in cases:
            chosen, lite, oracle = picked(arguments)
            assert chosen == lite == oracle, (bands[: i + 1], arguments)
    assert RoutingRuleVersion.objects.filter(tenant=tenant).count() == len(bands)


def test_the_claims_proposer_read_answers_as_its_orm_twin(
    runtime: Runtime, tenant: Tenant, reviewer: Any
) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    token = runtime.token(occurrence_id).json()["token"]
    token_hash = tokens.hash_secret(token)
    other = make_runtime(tenant, "another agent")

    def both() -> tuple[Any, Any]:
        with connection.cursor() as cursor:
            cursor.execute(_PROPOSER_SQL, [tenant.pk, token_hash])
            found = cursor.fetchone()
        return found, proposer_of_token(tenant_id=tenant.pk, token_hash=token_hash).first()

    assert both() == ((runtime.key.pk, ""), (runtime.key.pk, "")), both()
    RuntimeKey.objects.filter(pk=runtime.key.pk).update(runtime_group="crew")
    assert both() == ((runtime.key.pk, "crew"), (runtime.key.pk, "crew"))
    for caller, refused in ((runtime.key, False), (other.key, True)):
        assert claimed_by_other_key(caller, tenant=tenant, token_hash=token_hash) is refused
    RuntimeKey.objects.filter(pk=other.key.pk).update(runtime_group="crew")
    other.key.refresh_from_db()
    assert claimed_by_other_key(other.key, tenant=tenant, token_hash=token_hash) is False
    Occurrence.objects.filter(pk=occurrence_id).update(runtime_key=None)
    assert both() == ((None, None), (None, None))
    assert claimed_by_other_key(other.key, tenant=tenant, token_hash=token_hash) is False
    with connection.cursor() as cursor:
        cursor.execute(_PROPOSER_SQL, [tenant.pk, "0" * 64])
        assert cursor.fetchone() is None
    assert not claimed_by_other_key(other.key, tenant=tenant, token_hash="0" * 64)


def test_the_occurrence_read_answers_as_its_orm_twin(
    runtime: Runtime, tenant: Tenant, other_tenant: Tenant, reviewer: Any
) -> None:
    pending = runtime.propose(client_ref="pending").json()["occurrence_id"]
    claimed = runtime.propose(client_ref="claimed").json()["occurrence_id"]
    assert approve(claimed, reviewer).issued
    token = runtime.token(claimed).json()["token"]
    assert runtime.claim(token, "exec-twin").status_code == 200
    auto = runtime.propose("lookup_order", {"order_id": "ord_1"}).json()["occurrence_id"]
    for occurrence_id in (pending, claimed, auto):
        found = occurrence_get_for_tenant(tenant=tenant, occurrence_id=occurrence_id)
        twin = occurrence_detail_queryset().filter(tenant=tenant, pk=occurrence_id).first()
        assert found is not None and twin is not None
        assert _occurrence_out(found) == _occurrence_out(twin)
        assert found.tenant == twin.tenant and model_to_dict(found) == model_to_dict(twin)
        assert occurrence_get_for_tenant(tenant=other_tenant, occurrence_id=occurrence_id) is None
    assert occurrence_get_for_tenant(tenant=tenant, occurrence_id=str(uuid.uuid4())) is None
