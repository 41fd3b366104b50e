"""Issue 25, operators: a command the runtime executes itself, whose outcome was unknown,
stays in the queue after an operator accepts the ambiguity, as "waiting for the runtime"
with its age, until the runtime runs it again and reports; and the runtime is told that a
new attempt is admitted, by its callback and by its occurrence answer (``next_attempt``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import CallbackDelivery, Command
from approvals.vocabulary import QueueReason
from reconciliation.operator_actions import command_accept_ambiguity
from reconciliation.selectors.queue import queue_counts, queue_items
from tests.conftest import PASSWORD, Runtime
from tests.reconciliation.conftest import claim_command

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True


@pytest.fixture
def ops(operator: Any) -> Client:
    client = Client()
    assert client.login(username=operator.username, password=PASSWORD)
    return client


def report(runtime: Runtime, command: Command, execution_id: str, outcome: str) -> Any:
    return runtime.post(
        f"/api/v1/commands/{command.pk}/effect",
        {"execution_id": execution_id, "outcome": outcome},
    )


def unknown_case(runtime: Runtime, reviewer: Any, ref: str = "case-1") -> Command:
    """A close_case the runtime ran and could not tell the outcome of."""
    command = claim_command(runtime, reviewer, "close_case", ref=ref)
    assert report(runtime, command, "exec-1", "outcome_unknown").status_code == 200
    command.refresh_from_db()
    assert command.state == Command.State.OUTCOME_UNKNOWN
    return command


def waiting(runtime: Runtime) -> list[Any]:
    return queue_items(
        tenant_ids=[runtime.key.tenant_id],
        now=timezone.now(),
        reason=QueueReason.WAITING_FOR_RUNTIME,
    )


def test_an_accepted_ambiguity_keeps_the_runtimes_command_in_the_queue_until_it_reports(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = unknown_case(runtime, reviewer)

    done = command_accept_ambiguity(command_id=command.pk, operator="olga", note="CRM unsure")

    assert "the runtime that executes this command is told" in done.message
    [item] = waiting(runtime)
    assert item.command is not None and item.command.pk == command.pk
    counts = queue_counts(tenant_ids=[runtime.key.tenant_id], now=timezone.now())
    assert counts[QueueReason.WAITING_FOR_RUNTIME] == 1
    assert counts[QueueReason.OUTCOME_UNKNOWN] == 0
    page = ops.get("/operations/").content.decode()
    assert "waiting for the runtime" in page.lower()
    assert str(command.occurrence_id) in page
    timeline = ops.get(f"/operations/occurrences/{command.occurrence_id}/").content.decode()
    assert "It waits for the runtime" in timeline

    # The runtime runs it again under the admitted epoch and reports: it leaves the queue.
    epoch = f"operator-epoch-{done.decision.pk}"
    assert report(runtime, command, epoch, "committed").status_code == 200
    assert waiting(runtime) == []


def test_the_occurrence_answer_names_the_admitted_attempt(runtime: Runtime, reviewer: Any) -> None:
    command = unknown_case(runtime, reviewer)
    path = f"/api/v1/occurrences/{command.occurrence_id}"
    assert runtime.get(path).json()["next_attempt"] is None, "unknown is not an admission"

    done = command_accept_ambiguity(command_id=command.pk, operator="olga", note="CRM unsure")

    answer = runtime.get(path).json()
    attempt = answer["next_attempt"]
    assert attempt["number"] == 2
    assert attempt["execution_id"] == f"operator-epoch-{done.decision.pk}"
    assert attempt["justification"] == "ambiguity_accepted"
    assert answer["command"]["effect_state"] == "not_sent"
    # Reported: nothing more to run.
    assert report(runtime, command, attempt["execution_id"], "committed").status_code == 200
    assert runtime.get(path).json()["next_attempt"] is None


def register_callback(runtime: Runtime) -> None:
    registered = runtime.client.put(
        "/api/v1/callback",
        json.dumps({"url": "http://127.0.0.1:9/hooks"}),
        content_type="application/json",
    )
    assert registered.status_code == 200, registered.content


def test_the_runtimes_callback_is_told_of_the_admitted_attempt(
    runtime: Runtime, reviewer: Any
) -> None:
    register_callback(runtime)
    command = unknown_case(runtime, reviewer)

    done = command_accept_ambiguity(command_id=command.pk, operator="olga", note="CRM unsure")

    delivery = CallbackDelivery.objects.get(event="attempt_admitted")
    assert delivery.occurrence_id == command.occurrence_id
    assert delivery.body["decided_by"] == "olga"
    assert delivery.body["details"] == {
        "epoch": 2,
        "justification": "ambiguity_accepted",
        "execution_id": f"operator-epoch-{done.decision.pk}",
        "reason": "CRM unsure",
    }


def test_a_console_executed_or_self_requested_attempt_is_not_waiting_for_the_runtime(
    runtime: Runtime, reviewer: Any
) -> None:
    register_callback(runtime)
    # The runtime asks for its own epoch after a refusal: it knows, and it is running it.
    command = claim_command(runtime, reviewer, "close_case", ref="case-2")
    assert report(runtime, command, "exec-1", "rejected").status_code == 200
    again = runtime.post(
        f"/api/v1/occurrences/{command.occurrence_id}/epochs",
        {"execution_id": "exec-2", "reason": "the CRM was down"},
    )
    assert again.status_code == 201, again.content

    assert waiting(runtime) == []
    assert CallbackDelivery.objects.filter(event="attempt_admitted").count() == 0
