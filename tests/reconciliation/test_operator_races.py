"""Operators deciding about one command at once, in separate OS processes released by a
barrier, over HTTP against the real sandbox: one decision wins, every other operator is
refused with the state as it now stands (sent back to the timeline, which says so; never a
503), and the remote is called once.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from approvals.models import Command, Epoch, Membership
from reconciliation.dispatch import command_dispatch
from reconciliation.models import AdapterInvocation, OperatorDecision
from tests.conftest import Runtime, make_user
from tests.demo.sandbox_fixture import SandboxProcess
from tests.races import RACE, Pool
from tests.reconciliation.conftest import claim_command

pytestmark = RACE

OPERATORS = 4
ROUNDS = 5
AMBIGUITY_OPERATORS = 6
AMBIGUITY_ROUNDS = 8

State = Command.State

_NOTICE = re.compile(r'id="operator-notice"[^>]*>([^<]*)<')


# --- what the workers run (module level, so the jobs can be pickled by name) -------------


def decide_job(
    username: str, command_id: str, action: str, seen_state: str, deliver: bool = False
) -> tuple[str, str]:
    """One operator's POST of a decision from the page they were shown: ("decided" or
    "refused", the refusal's notice on the timeline the answer redirects to). ``deliver``:
    a winning decision's delivery starts at once, as a worker picks up its message."""
    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    response = client.post(
        f"/operations/commands/{command_id}/{action}",
        {"note": f"{username} decided", "seen_state": seen_state},
    )
    # Winner and losers alike are sent back to the timeline (post/redirect/get).
    assert response.status_code == 302, response.status_code
    found = _NOTICE.search(client.get(response["Location"]).content.decode())
    if found is None and deliver:
        command_dispatch(command_id=command_id, message_id=f"after-{username}")
    return ("refused", unescape(found.group(1))) if found else ("decided", "")


_SEEN_STATE = re.compile(r'name="seen_state" value="([^"]*)"')


def shown_state(username: str, command: Command) -> str:
    """The state the occurrence's page shows an operator, as its forms will post it."""
    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    page = client.get(f"/operations/occurrences/{command.occurrence_id}/").content.decode()
    found = _SEEN_STATE.search(page)
    assert found, "every decision's form names the state it was shown"
    return found.group(1)


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def operators(tenant: Any, operator: Any) -> list[str]:
    others = [
        make_user(f"op{n}", tenant, Membership.Role.OPERATOR).username
        for n in range(1, AMBIGUITY_OPERATORS)
    ]
    return [operator.username, *others]


def _pool(size: int) -> Iterator[Pool]:
    workers = Pool(size)
    try:
        yield workers
    finally:
        workers.close()


@pytest.fixture
def compensators(transactional_db: Any, remote: SandboxProcess) -> Iterator[Pool]:
    """Forked after ``remote`` pointed the adapters at the sandbox."""
    yield from _pool(OPERATORS)


@pytest.fixture
def ambiguity_pool(transactional_db: Any, remote: SandboxProcess) -> Iterator[Pool]:
    yield from _pool(AMBIGUITY_OPERATORS)


# --- compensation ---------------------------------------------------------------------------


def _reversals(remote: SandboxProcess, command: Command) -> list[dict[str, Any]]:
    return [
        r
        for r in remote.requests()
        if r["path"].endswith("/reversal") and r["idempotency_key"] == command.idempotency_key
    ]


def test_operators_compensating_at_once_call_the_remote_once(
    compensators: Pool,
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    operators: list[str],
) -> None:
    for round_no in range(ROUNDS):
        command = claim_command(runtime, reviewer, ref=f"comp-{round_no}")
        command_dispatch(command_id=command.pk)
        command.refresh_from_db()
        assert command.state == State.COMMITTED

        decide = {
            "command_id": str(command.pk),
            "action": "compensate",
            "seen_state": shown_state(operators[0], command),
        }
        results = compensators.run(
            [(decide_job, {**decide, "username": name}) for name in operators[:OPERATORS]]
        )

        assert len(_reversals(remote, command)) == 1, ("one reversal call", results)
        assert Counter(status for status, _ in results) == {
            "decided": 1,
            "refused": OPERATORS - 1,
        }, results
        for status, notice in results:
            if status == "refused":
                # Refused while the winner's call was out, or after it settled the effect.
                assert (
                    "a compensation of this effect is already in progress" in notice
                    or "Refused: the effect is now compensated" in notice
                ), notice
        calls = AdapterInvocation.objects.filter(command=command, kind="compensate")
        assert [(c.outcome, c.finished_at is not None) for c in calls] == [("committed", True)]
        command.refresh_from_db()
        assert command.state == State.COMPENSATED
        assert OperatorDecision.objects.filter(command=command).count() == 1


# --- accepting the ambiguity ------------------------------------------------------------------


def test_operators_accepting_one_ambiguity_at_once_never_deadlock(
    ambiguity_pool: Pool,
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    operators: list[str],
) -> None:
    """The winner's new epoch is delivered at once (a worker locks the command and writes
    its audit event) while the other operators are still queued on the occurrence: every
    path takes the occurrence before the command, so no cycle forms."""
    for round_no in range(AMBIGUITY_ROUNDS):
        command = claim_command(runtime, reviewer, "send_message", ref=f"amb-{round_no}")
        remote.fault("timeout_after_effect")
        command_dispatch(command_id=command.pk)
        command.refresh_from_db()
        assert command.state == State.OUTCOME_UNKNOWN

        decide = {
            "command_id": str(command.pk),
            "action": "accept-ambiguity",
            "seen_state": shown_state(operators[0], command),
            "deliver": True,
        }
        results = ambiguity_pool.run(
            [(decide_job, {**decide, "username": name}) for name in operators]
        )

        assert Counter(status for status, _ in results) == {
            "decided": 1,
            "refused": AMBIGUITY_OPERATORS - 1,
        }, results
        for status, notice in results:
            if status == "refused":
                assert notice.startswith("Refused: the effect is now "), notice
        epochs = Epoch.objects.filter(occurrence_id=command.occurrence_id)
        assert epochs.count() == 2
        assert OperatorDecision.objects.filter(command=command).count() == 1
