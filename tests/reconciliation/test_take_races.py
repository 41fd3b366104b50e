""" "I'm on it" raced: operators in separate OS processes, released together by a barrier,
take the same item. One wins; every other is told who has it, and one audit event says who
took it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from approvals.errors import ServiceError
from approvals.models import AuditEvent, Membership, Tenant
from approvals.vocabulary import AuditKind
from reconciliation.models import QueueTake
from reconciliation.takes import occurrence_take
from tests.conftest import Runtime, make_user
from tests.races import RACE, Pool
from tests.reconciliation.test_queue_identifies import expired

pytestmark = RACE

OPERATORS = 4
ROUNDS = 4


def take_job(username: str, occurrence_id: str, tenant_id: int, take_over: Any = None) -> Any:
    user = get_user_model().objects.get(username=username)
    try:
        occurrence_take(
            occurrence_id=occurrence_id, tenant_ids=[tenant_id], user=user, take_over=take_over
        )
    except ServiceError as refusal:
        return ("refused", str(refusal.code), refusal.message)
    return ("taken", username, "")


@pytest.fixture
def pool() -> Iterator[Pool]:
    workers = Pool(OPERATORS)
    yield workers
    workers.close()


def test_of_operators_taking_one_item_at_once_one_wins_and_the_others_hear_who(
    runtime: Runtime, reviewer: Any, tenant: Tenant, pool: Pool
) -> None:
    names = [f"op{n}" for n in range(OPERATORS)]
    for name in names:
        make_user(name, tenant, Membership.Role.OPERATOR)
    for round_ in range(ROUNDS):
        item = expired(runtime, reviewer, f"pay_{round_}", minutes_ago=10)
        if round_ % 2:
            # Half the rounds start from an existing, let-go row (the update's race,
            # rather than the first insert's).
            QueueTake.objects.create(occurrence_id=item.occurrence_id, tenant_id=tenant.pk)

        results = pool.run(
            [
                (
                    take_job,
                    {
                        "username": n,
                        "occurrence_id": str(item.occurrence_id),
                        "tenant_id": tenant.pk,
                    },
                )
                for n in names
            ]
        )

        assert Counter(r[0] for r in results) == {"taken": 1, "refused": OPERATORS - 1}, results
        [winner] = [r[1] for r in results if r[0] == "taken"]
        for outcome, code, message in results:
            if outcome == "refused":
                assert code == "taken_by_other" and message.startswith(f"{winner} is on it"), (
                    message
                )
        row = QueueTake.objects.get(occurrence_id=item.occurrence_id)
        assert row.holder is not None and row.holder.username == winner
        taken = AuditEvent.objects.filter(
            kind=AuditKind.OPERATIONS_TAKEN, occurrence_id=item.occurrence_id
        )
        assert [e.actor for e in taken] == [winner]


def test_of_operators_taking_over_from_the_same_holder_at_once_one_wins(
    runtime: Runtime, reviewer: Any, tenant: Tenant, pool: Pool
) -> None:
    holder = make_user("holder", tenant, Membership.Role.OPERATOR)
    names = [f"op{n}" for n in range(OPERATORS)]
    for name in names:
        make_user(name, tenant, Membership.Role.OPERATOR)
    item = expired(runtime, reviewer, "pay_x", minutes_ago=10)
    occurrence_take(occurrence_id=item.occurrence_id, tenant_ids=[tenant.pk], user=holder)

    results = pool.run(
        [
            (
                take_job,
                {
                    "username": n,
                    "occurrence_id": str(item.occurrence_id),
                    "tenant_id": tenant.pk,
                    "take_over": holder.pk,
                },
            )
            for n in names
        ]
    )

    assert Counter(r[0] for r in results) == {"taken": 1, "refused": OPERATORS - 1}, results
    [winner] = [r[1] for r in results if r[0] == "taken"]
    assert all(r[2].startswith(f"{winner} is on it") for r in results if r[0] == "refused")
    over = AuditEvent.objects.filter(kind=AuditKind.OPERATIONS_TAKEN_OVER)
    assert [(e.actor, e.data["from"]) for e in over] == [(winner, "holder")]
