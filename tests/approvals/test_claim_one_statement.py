"""Issue 28: on PostgreSQL an admitted claim is one statement: the guard's conditional
UPDATE and, from the row it returns, the epoch, the command, the occurrence's status and
the audit event, as data-modifying ``WITH`` queries (``approvals.claims.sql.
consume_and_write``). It writes exactly the rows the ORM path (SQLite's) writes, a refusal
writes none of them, and the races in OS processes (test_claim_race.py) hold as before."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from approvals.claims import sql as claim_sql
from approvals.claims.claim import approval_claim
from approvals.models import Approval, AuditEvent, Command, Epoch, Occurrence
from tests.conftest import REFUND_ARGS, Runtime, approve

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the statement is PostgreSQL's"),
]

WRITES = ("INSERT", "UPDATE", "DELETE", "WITH")


def _approved_token(runtime: Runtime, reviewer: Any, ref: str) -> tuple[str, str]:
    occurrence_id = runtime.propose(client_ref=ref).json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    return occurrence_id, runtime.token(occurrence_id).json()["token"]


def _claim(runtime: Runtime, token: str, execution_id: str = "exec-1") -> Any:
    return approval_claim(
        tenant=runtime.key.tenant,
        token=token,
        tool="issue_refund",
        arguments=dict(REFUND_ARGS),
        execution_id=execution_id,
        message_id="msg-1",
        runtime_key=runtime.key,
    )


def _written(occurrence_id: str) -> dict[str, Any]:
    """What a claim wrote for an occurrence, without what differs by nature (ids, times,
    the occurrence and approval it belongs to)."""
    unlike = {"id", "occurrence", "approval", "epoch", "created_at", "updated_at"}
    epoch = Epoch.objects.get(occurrence_id=occurrence_id)
    command = Command.objects.get(occurrence_id=occurrence_id)
    event = AuditEvent.objects.get(occurrence_id=occurrence_id, kind="claim.approved")
    event_fields = model_to_dict(
        event,
        exclude=[*unlike, "event_id", "command_id", "source_time", "trace_id", "token_fingerprint"],
    )
    event_fields["data"] = {**event.data, "idempotency_key": "-"}
    return {
        "epoch": model_to_dict(epoch, exclude=unlike),
        "command": model_to_dict(command, exclude=[*unlike, "idempotency_key"]),
        "command_key_is_its_id": command.idempotency_key == f"cmd_{command.id.hex}",
        "event_names_the_command": event.command_id == command.id,
        "event_fingerprint_is_the_approvals": event.token_fingerprint
        == Approval.objects.get(command=command).fingerprint,
        "event": event_fields,
        "status": Occurrence.objects.get(pk=occurrence_id).status,
    }


def test_the_statement_writes_what_the_orm_path_writes(
    runtime: Runtime, reviewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    through_sql, sql_token = _approved_token(runtime, reviewer, "one")
    through_orm, orm_token = _approved_token(runtime, reviewer, "two")

    by_sql = _claim(runtime, sql_token)
    monkeypatch.setattr(claim_sql, "claim_one_statement", lambda: False)
    by_orm = _claim(runtime, orm_token)

    assert by_sql.decision == by_orm.decision == "approved"
    assert _written(through_sql) == _written(through_orm)
    # The command handed back is the row as stored.
    stored = Command.objects.get(pk=by_sql.command.pk)
    assert model_to_dict(by_sql.command) == model_to_dict(stored)
    assert by_sql.command.created_at == stored.created_at


def test_an_admitted_claim_writes_in_one_statement(runtime: Runtime, reviewer: Any) -> None:
    _, token = _approved_token(runtime, reviewer, "one")

    with CaptureQueriesContext(connection) as queries:
        assert _claim(runtime, token).decision == "approved"

    writes = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith(WRITES)]
    assert len(writes) == 1, writes
    assert writes[0].lstrip().upper().startswith("WITH")


def test_a_refused_claim_writes_nothing_but_its_refusal(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id, token = _approved_token(runtime, reviewer, "one")
    assert _claim(runtime, token, "exec-1").decision == "approved"

    replay = _claim(runtime, token, "exec-2")

    assert replay.decision == "replayed"
    assert Epoch.objects.filter(occurrence_id=occurrence_id).count() == 1
    assert Command.objects.filter(occurrence_id=occurrence_id).count() == 1
    assert (
        AuditEvent.objects.filter(occurrence_id=occurrence_id, kind="claim.approved").count() == 1
    )
