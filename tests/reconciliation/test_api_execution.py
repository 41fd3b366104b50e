"""The execution endpoints of the agent API: who executes a command, a runtime's effect
report, a command's evidence, and a request for another epoch."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import AuditEvent, Command, Epoch
from tests.conftest import Runtime, make_runtime
from tests.reconciliation.conftest import CASE_ARGS, claim_command

pytestmark = pytest.mark.django_db

CHALLENGE = 'Bearer realm="crm", error="invalid_token", scope="cases:write"'


def report(runtime: Runtime, command: Command, execution_id: str = "exec-1", **body: Any) -> Any:
    return runtime.post(
        f"/api/v1/commands/{command.pk}/effect", {"execution_id": execution_id, **body}
    )


def test_the_claim_says_who_executes_the_command(runtime: Runtime, reviewer: Any) -> None:
    refund = claim_command(runtime, reviewer, ref="r1")
    case = claim_command(runtime, reviewer, "close_case", ref="r2")

    assert refund.executed_by == "console"
    assert case.executed_by == "runtime"
    detail = runtime.get(f"/api/v1/occurrences/{case.occurrence_id}").json()
    [command] = detail["commands"]
    assert command["executed_by"] == "runtime"
    assert (command["state"], command["effect_state"]) == ("pending", "not_sent")


def test_claim_answer_carries_executed_by(runtime: Runtime, reviewer: Any) -> None:
    from tests.conftest import approve

    occurrence_id = runtime.propose(tool="close_case", arguments=CASE_ARGS).json()["occurrence_id"]
    approve(occurrence_id, reviewer)
    token = runtime.token(occurrence_id).json()["token"]

    answer = runtime.claim(token, "exec-9", tool="close_case", arguments=CASE_ARGS).json()
    again = runtime.claim(token, "exec-9", tool="close_case", arguments=CASE_ARGS).json()

    assert answer["decision"] == "approved" and answer["executed_by"] == "runtime"
    assert again["decision"] == "duplicate_delivery" and again["executed_by"] == "runtime"


def test_the_claiming_execution_reports_a_committed_effect(runtime: Runtime, reviewer: Any) -> None:
    command = claim_command(runtime, reviewer, "close_case")

    response = report(runtime, command, outcome="committed", receipt="case_77 closed")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["effect_state"] == "committed"
    assert body["executed_by"] == "runtime"
    event = AuditEvent.objects.get(command_id=command.pk, kind="effect.committed")
    assert event.actor == "runtime:agent"
    assert event.execution_id == "exec-1"
    assert event.data["receipt"] == "case_77 closed"
    # The same report again is accepted once.
    assert report(runtime, command, outcome="committed").status_code == 200
    assert AuditEvent.objects.filter(command_id=command.pk, kind="effect.committed").count() == 1


def test_another_execution_may_not_report_and_is_recorded(runtime: Runtime, reviewer: Any) -> None:
    command = claim_command(runtime, reviewer, "close_case")

    response = report(runtime, command, execution_id="exec-intruder", outcome="committed")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "not_your_command"
    command.refresh_from_db()
    assert command.state == Command.State.PENDING
    refused = AuditEvent.objects.get(command_id=command.pk, kind="effect.report_refused")
    assert (refused.execution_id, refused.reason_code) == ("exec-intruder", "other_execution")


def test_another_tenant_cannot_see_or_report_on_a_command(
    runtime: Runtime, reviewer: Any, other_runtime: Runtime
) -> None:
    command = claim_command(runtime, reviewer, "close_case")

    assert other_runtime.get(f"/api/v1/commands/{command.pk}").status_code == 404
    assert report(other_runtime, command, outcome="committed").status_code == 404
    assert other_runtime.get("/api/v1/commands/not-a-uuid").status_code == 404


def test_a_console_executed_command_refuses_runtime_reports(
    runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)

    response = report(runtime, command, outcome="committed")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "executed_by_console"


def test_an_interrupted_report_keeps_the_challenges_and_rejects_the_effect(
    runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer, "close_case")

    response = report(
        runtime, command, outcome="interrupted", challenges=[CHALLENGE], detail="401 from CRM"
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["effect_state"] == "rejected"
    [interruption] = body["interruptions"]
    assert interruption["challenges"] == [CHALLENGE]
    assert interruption["resolved_at"] is None


def test_a_settled_effect_cannot_be_contradicted(runtime: Runtime, reviewer: Any) -> None:
    command = claim_command(runtime, reviewer, "close_case")
    report(runtime, command, outcome="committed")

    response = report(runtime, command, outcome="rejected")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "effect_already_recorded"


def test_bad_effect_reports_are_422_and_write_nothing(runtime: Runtime, reviewer: Any) -> None:
    command = claim_command(runtime, reviewer, "close_case")
    before = AuditEvent.objects.count()

    for body in (
        {"execution_id": "exec-1", "outcome": "done"},
        {"execution_id": "exec-1"},
        {"execution_id": "exec-1", "outcome": "committed", "extra": 1},
        {"execution_id": "exec-1", "outcome": "committed", "challenges": "x"},
    ):
        response = runtime.post(f"/api/v1/commands/{command.pk}/effect", body)
        assert response.status_code == 422, (body, response.content)
        assert "error" in response.json()
    assert AuditEvent.objects.count() == before


def test_a_new_epoch_needs_reconciliation_while_the_effect_is_unknown(
    runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer, "close_case")
    report(runtime, command, outcome="outcome_unknown", detail="the CRM timed out")

    response = runtime.post(
        f"/api/v1/occurrences/{command.occurrence_id}/epochs",
        {"execution_id": "exec-2", "reason": "the run resumed"},
    )

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "needs_reconciliation"
    assert "outcome_unknown" in error["message"] and str(command.pk) in error["message"]
    assert Epoch.objects.filter(occurrence_id=command.occurrence_id).count() == 1


def test_a_rejected_effect_admits_a_new_epoch_with_its_justification(
    runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer, "close_case")
    report(runtime, command, outcome="interrupted", challenges=[CHALLENGE])

    response = runtime.post(
        f"/api/v1/occurrences/{command.occurrence_id}/epochs",
        {"execution_id": "exec-2", "reason": "signed in again"},
    )

    assert response.status_code == 201, response.content
    epoch = response.json()
    assert epoch["number"] == 2 and epoch["previous_epoch"] == 1
    assert epoch["justification"] == "rejected"
    assert epoch["command_id"] == str(command.pk)
    # The old execution may no longer report; the new one may.
    assert report(runtime, command, outcome="committed").status_code == 403
    assert report(runtime, command, "exec-2", outcome="committed").status_code == 200
    detail = runtime.get(f"/api/v1/commands/{command.pk}").json()
    assert [e["number"] for e in detail["epochs"]] == [1, 2]
    admission = detail["epochs"][1]["admission"]
    assert admission["justification"] == "rejected"
    assert admission["decided_by"] == "runtime:agent"
    assert admission["interruption"] == detail["interruptions"][0]["id"]
    assert detail["interruptions"][0]["resolved_at"] is not None
    # The approval stays consumed: the token admits nothing more.
    assert detail["effect_state"] == "committed"


def test_an_epoch_is_refused_before_any_claim_and_after_a_commit(
    runtime: Runtime, reviewer: Any
) -> None:
    proposed = runtime.propose(tool="close_case", arguments=CASE_ARGS).json()
    before = runtime.post(
        f"/api/v1/occurrences/{proposed['occurrence_id']}/epochs",
        {"execution_id": "exec-2", "reason": "again"},
    )
    assert before.status_code == 409 and before.json()["error"]["code"] == "no_command"

    command = claim_command(runtime, reviewer, "close_case", ref="c2")
    report(runtime, command, outcome="committed")
    after = runtime.post(
        f"/api/v1/occurrences/{command.occurrence_id}/epochs",
        {"execution_id": "exec-3", "reason": "again"},
    )
    assert after.status_code == 409 and after.json()["error"]["code"] == "effect_committed"


def test_command_detail_lists_invocations_and_epochs(runtime: Runtime, reviewer: Any) -> None:
    command = claim_command(runtime, reviewer, "close_case")

    body = runtime.get(f"/api/v1/commands/{command.pk}").json()

    assert body["command_id"] == str(command.pk)
    assert body["idempotency_key"] == command.idempotency_key
    assert body["invocation_count"] == 0 and body["invocations"] == []
    assert [(e["number"], e["justification"]) for e in body["epochs"]] == [(1, "approval")]
    assert body["epochs"][0]["admission"] is None


def test_any_key_of_the_tenant_reads_but_only_the_execution_reports(
    runtime: Runtime, reviewer: Any, tenant: Any
) -> None:
    command = claim_command(runtime, reviewer, "close_case")
    second = make_runtime(tenant, "second-agent")

    assert second.get(f"/api/v1/commands/{command.pk}").status_code == 200
    assert report(second, command, "exec-other", outcome="committed").status_code == 403


def test_execution_endpoints_are_in_the_openapi_schema(runtime: Runtime) -> None:
    schema = runtime.get("/api/v1/openapi.json").json()
    paths = schema["paths"]
    assert "/api/v1/commands/{command_id}" in paths
    assert "/api/v1/commands/{command_id}/effect" in paths
    assert "/api/v1/occurrences/{occurrence_id}/epochs" in paths
    claim_ok = schema["components"]["schemas"]["ClaimOut"]
    assert "executed_by" in claim_ok["properties"]
