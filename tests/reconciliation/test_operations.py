"""The operators' console: the queue, an occurrence's timeline, and each decision, refused
with the new state shown when the state no longer allows it."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import (
    Approval,
    AuditEvent,
    Command,
    Epoch,
    Membership,
    Occurrence,
    ToolContract,
)
from approvals.vocabulary import QUEUE_REASONS, QueueReason
from reconciliation.adapters.payments import PaymentsAdapter
from reconciliation.dispatch import begin, command_dispatch
from reconciliation.models import AdapterInvocation, EpochAdmission, OperatorDecision
from reconciliation.operator_actions import command_accept_ambiguity
from reconciliation.selectors import queue as queue_selectors
from reconciliation.selectors import timeline as timeline_selectors
from reconciliation.selectors.queue import (
    _queue_querysets,
    queue_counts,
    queue_item_arguments,
    queue_items,
)
from tests.conftest import PASSWORD, Runtime, approve, make_user
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation.conftest import claim_command

pytestmark = pytest.mark.django_db

State = Command.State


@pytest.fixture
def ops(operator: Any) -> Client:
    client = Client()
    assert client.login(username=operator.username, password=PASSWORD)
    return client


def act(client: Client, command: Command, action: str, **fields: str) -> Any:
    return client.post(
        f"/operations/commands/{command.pk}/{action}", {"note": "checked the ledger", **fields}
    )


def refused(client: Client, response: Any, command: Command) -> str:
    """A refusal answers with a redirect to the timeline (post/redirect/get: a reload never
    re-sends); the page it leads to says why, in its alert."""
    assert response.status_code == 302, response.status_code
    assert response["Location"] == f"/operations/occurrences/{command.occurrence_id}/"
    page = client.get(response["Location"])
    assert page.status_code == 200
    return str(page.content.decode())


def unknown_message(
    runtime: Runtime, reviewer: Any, remote: SandboxProcess, ref: str = ""
) -> Command:
    command = claim_command(runtime, reviewer, "send_message", ref=ref)
    remote.fault("timeout_after_effect")
    command_dispatch(command_id=command.pk)
    command.refresh_from_db()
    assert command.state == State.OUTCOME_UNKNOWN
    return command


# --- access -------------------------------------------------------------------------------


def test_only_operators_open_the_operations_console(
    client: Client, reviewer: Any, operator: Any
) -> None:
    assert client.get("/operations/").status_code == 302  # sign in first
    client.login(username=reviewer.username, password=PASSWORD)
    assert client.get("/operations/").status_code == 403
    client.login(username=operator.username, password=PASSWORD)
    assert client.get("/operations/").status_code == 200


def test_another_tenants_occurrence_is_not_found(
    remote: SandboxProcess, other_runtime: Runtime, other_tenant: Any, ops: Client
) -> None:
    other_reviewer = make_user("olga", other_tenant, Membership.Role.REVIEWER)
    command = unknown_message(other_runtime, other_reviewer, remote)

    assert ops.get(f"/operations/occurrences/{command.occurrence_id}/").status_code == 404
    assert act(ops, command, "reconcile", outcome="committed", evidence="x").status_code == 404
    command.refresh_from_db()
    assert command.state == State.OUTCOME_UNKNOWN


def test_actions_need_csrf(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, operator: Any
) -> None:
    command = unknown_message(runtime, reviewer, remote)
    client = Client(enforce_csrf_checks=True)
    client.login(username=operator.username, password=PASSWORD)

    response = act(client, command, "reconcile", outcome="committed", evidence="msg_1")

    assert response.status_code == 403
    assert not OperatorDecision.objects.exists()


# --- the queue ----------------------------------------------------------------------------


def _expired_unclaimed(runtime: Runtime, reviewer: Any, ref: str, minutes_ago: int) -> str:
    occurrence_id: str = runtime.propose(client_ref=ref).json()["occurrence_id"]
    approve(occurrence_id, reviewer)
    Approval.objects.filter(occurrence_id=occurrence_id).update(
        issued_at=timezone.now() - timedelta(hours=2),
        expires_at=timezone.now() - timedelta(minutes=minutes_ago),
    )
    return occurrence_id


def _one_of_each_reason(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, settings: Any
) -> tuple[Command, Command]:
    """An outcome unknown, an interruption, an approval expired unclaimed and a command
    stuck sending (nothing stuck before dispatch); returns the first two commands."""
    unknown = unknown_message(runtime, reviewer, remote, ref="m1")
    interrupted = claim_command(runtime, reviewer, ref="r1")
    remote.fault("unauthorized")
    command_dispatch(command_id=interrupted.pk)
    _expired_unclaimed(runtime, reviewer, "r2", 1)
    begin(command_id=claim_command(runtime, reviewer, ref="r3").pk)
    settings.OPERATIONS_STUCK_SECONDS = 0
    return unknown, interrupted


def test_the_queue_lists_what_needs_a_person_oldest_first_with_counts(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client, settings: Any
) -> None:
    unknown, interrupted = _one_of_each_reason(remote, runtime, reviewer, settings)

    page = ops.get("/operations/").content.decode()

    assert "<strong>1</strong> outcome unknown" in page
    assert "<strong>1</strong> interrupted" in page
    assert "<strong>1</strong> approval expired unclaimed" in page
    assert "<strong>1</strong> stuck sending" in page
    assert str(unknown.occurrence_id) in page and str(interrupted.occurrence_id) in page
    assert "80.00" in page, "the amount read for people"
    only_unknown = ops.get("/operations/?reason=outcome_unknown").content.decode()
    assert str(unknown.occurrence_id) in only_unknown
    assert str(interrupted.occurrence_id) not in only_unknown
    by_tool = ops.get("/operations/?tool=send_message").content.decode()
    assert str(unknown.occurrence_id) in by_tool and str(interrupted.occurrence_id) not in by_tool


def test_the_queue_poll_renders_the_list_alone(ops: Client) -> None:
    response = ops.get("/operations/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="queue-list"') and "<html" not in body


@pytest.mark.slow  # five messages, each waiting out the adapter's 1 s read timeout
def test_queries_per_queue_page_do_not_grow_with_rows(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    unknown_message(runtime, reviewer, remote, ref="a")
    with CaptureQueriesContext(connection) as few:
        assert ops.get("/operations/").status_code == 200
    for n in range(4):
        unknown_message(runtime, reviewer, remote, ref=f"b{n}")
    with CaptureQueriesContext(connection) as many:
        response = ops.get("/operations/")
    assert (
        response.status_code == 200
        and "<strong>5</strong> outcome unknown" in response.content.decode()
    )
    assert len(many) == len(few)


def test_the_queues_counts_are_one_statement_with_each_reasons_own_count(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, settings: Any
) -> None:
    _one_of_each_reason(remote, runtime, reviewer, settings)
    unknown_message(runtime, reviewer, remote, ref="m2")
    now = timezone.now()
    tenant_ids = [runtime.key.tenant_id]

    with CaptureQueriesContext(connection) as queries:
        counts = queue_counts(tenant_ids=tenant_ids, now=now)

    assert len(queries) == 1
    separately = {
        reason: queryset.count()
        for reason, (queryset, _) in _queue_querysets(tenant_ids, now, None).items()
    }
    assert counts == separately
    assert counts == {
        QueueReason.OUTCOME_UNKNOWN: 2,
        QueueReason.INTERRUPTED: 1,
        QueueReason.STUCK_SENDING: 1,
        QueueReason.STUCK_PENDING: 0,
        QueueReason.WAITING_FOR_RUNTIME: 0,
        QueueReason.EXPIRED_UNCLAIMED: 1,
    }
    send_message = ToolContract.objects.get(name="send_message").pk
    by_tool = queue_counts(tenant_ids=tenant_ids, now=now, tool_id=send_message)
    assert by_tool[QueueReason.OUTCOME_UNKNOWN] == 2
    assert by_tool[QueueReason.INTERRUPTED] == 0


def test_the_queues_sql_reads_answer_as_their_orm_twins(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, settings: Any
) -> None:
    """On PostgreSQL the queue reads through plain SQL; SQLite runs the ORM twins. Both
    give the same items, each with the same occurrence, tool, tenant and command."""
    if connection.vendor != "postgresql":
        pytest.skip("the SQL reads run on PostgreSQL only")
    _one_of_each_reason(remote, runtime, reviewer, settings)
    unknown_message(runtime, reviewer, remote, ref="m2")
    now = timezone.now()
    tenant_ids = [runtime.key.tenant_id]
    send_message = ToolContract.objects.get(name="send_message").pk

    def shown(items: list[Any]) -> list[Any]:
        return [
            (
                i.key,
                i.reason,
                i.since,
                i.occurrence.pk,
                i.occurrence.tool.name,
                i.occurrence.tenant.slug,
                i.command.pk if i.command else None,
                queue_item_arguments(i),
            )
            for i in items
        ]

    for tool_id in (None, send_message):
        for reason in ("", *QUEUE_REASONS):
            read = queue_items(tenant_ids=tenant_ids, now=now, reason=reason, tool_id=tool_id)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(queue_selectors, "on_postgresql", lambda: False)
                twin = queue_items(tenant_ids=tenant_ids, now=now, reason=reason, tool_id=tool_id)
                twin_counts = queue_counts(tenant_ids=tenant_ids, now=now, tool_id=tool_id)
            assert shown(read) == shown(twin), (reason, tool_id)
            assert queue_counts(tenant_ids=tenant_ids, now=now, tool_id=tool_id) == twin_counts
    assert len(queue_items(tenant_ids=tenant_ids, now=now)) == 5


def test_the_timelines_sql_reads_answer_as_their_orm_twins(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, settings: Any
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the SQL reads run on PostgreSQL only")
    unknown, interrupted = _one_of_each_reason(remote, runtime, reviewer, settings)
    tenant_ids = [runtime.key.tenant_id]

    def row(instance: Any) -> dict[str, Any]:
        fields = type(instance)._meta.concrete_fields
        return {f.attname: getattr(instance, f.attname) for f in fields}

    for command in (unknown, interrupted):
        occurrence_id = command.occurrence_id
        read = timeline_selectors._records(occurrence_id)
        twin = timeline_selectors._records_queryset(occurrence_id)
        assert read.pop("total") == timeline_selectors._events_total(occurrence_id)
        assert read.keys() == twin.keys()
        for name in read:
            assert [row(r) for r in read[name]] == [row(r) for r in twin[name]], name
        assert any(read[name] for name in ("invocations", "interruptions", "epochs"))
        found = timeline_selectors._occurrence(occurrence_id, tenant_ids)
        orm = Occurrence.objects.select_related("tool", "tenant", "runtime_key").get(
            pk=occurrence_id
        )
        assert found is not None
        assert [row(found), row(found.tool), row(found.tenant)] == [
            row(orm),
            row(orm.tool),
            row(orm.tenant),
        ]
        assert timeline_selectors._occurrence(occurrence_id, [0]) is None
        events = list(AuditEvent.objects.filter(occurrence_id=occurrence_id).order_by("id"))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(timeline_selectors, "on_postgresql", lambda: False)
            twin_times = [timeline_selectors._next_event_time(occurrence_id, e.pk) for e in events]
        times = [timeline_selectors._next_event_time(occurrence_id, e.pk) for e in events]
        assert times == twin_times and times[-1] is None


# --- the timeline ---------------------------------------------------------------------------


def test_the_timeline_shows_the_three_dimensions_and_every_step(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    remote.fault("unauthorized")
    command_dispatch(command_id=command.pk)

    response = ops.get(f"/operations/occurrences/{command.occurrence_id}/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "Why nothing runs:" in page and "It waits for authority" in page
    for title in ("Recovery", "Authority", "Effect"):
        assert f">{title}</h2>" in page
    assert "Stopped: authentication challenge" in page
    assert "Bearer realm=&quot;payments&quot;" in page
    for kind in (
        "occurrence.proposed",
        "approval.issued",
        "claim.approved",
        "effect.sending",
        "effect.rejected",
        "recovery.interrupted",
        "invocation.execute",
    ):
        assert kind in page, kind
    for event in AuditEvent.objects.filter(occurrence_id=command.occurrence_id):
        assert str(event.event_id) in page


def test_queries_per_timeline_do_not_grow_with_events(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = unknown_message(runtime, reviewer, remote)
    url = f"/operations/occurrences/{command.occurrence_id}/"
    with CaptureQueriesContext(connection) as few:
        assert ops.get(url).status_code == 200
    token_claims = [runtime.claim("apv_bogus", f"x-{n}") for n in range(3)]
    assert all(r.status_code == 403 for r in token_claims)
    act(ops, command, "reconcile", outcome="committed", evidence="msg_1")
    ops.get(url)  # shows (and so deletes) the decision's message from the session
    with CaptureQueriesContext(connection) as many:
        response = ops.get(url)
    assert response.status_code == 200 and "operator.reconcile" in response.content.decode()
    assert len(many) == len(few)


# --- decisions ------------------------------------------------------------------------------


def test_query_effect_finds_a_committed_refund_with_its_receipt(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client, operator: Any
) -> None:
    command = claim_command(runtime, reviewer)
    begin(command_id=command.pk)  # a worker died after phase 1 ...
    remote.client.post(  # ... and the refund went out anyway (as seen by the remote)
        "/v1/refunds",
        json={"payment_id": "pay_123", "amount_minor": 8000, "currency": "EUR", "reason": "x"},
        headers={
            "Authorization": f"Bearer {remote.api_key}",
            "Idempotency-Key": command.idempotency_key,
        },
    )
    [refund] = remote.refunds()

    response = act(ops, command, "query-effect")

    assert response.status_code == 302
    command.refresh_from_db()
    assert command.state == State.COMMITTED
    decision = OperatorDecision.objects.get(command=command)
    assert (decision.action, decision.finding, decision.evidence) == (
        "query_effect",
        "committed",
        refund["id"],
    )
    assert decision.operator == operator.username and decision.note == "checked the ledger"
    event = AuditEvent.objects.get(kind="operator.query_effect")
    assert event.actor == operator.username and event.data["receipt"] == refund["id"]
    page = ops.get(f"/operations/occurrences/{command.occurrence_id}/").content.decode()
    assert "The adapter found the effect: committed" in page


def test_query_effect_not_found_reconciles_as_not_committed_and_justifies_a_retry(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    begin(command_id=command.pk)

    act(ops, command, "query-effect")
    command.refresh_from_db()
    assert command.state == State.RECONCILED

    response = act(ops, command, "retry")

    assert response.status_code == 302
    epoch = Epoch.objects.get(occurrence_id=command.occurrence_id, number=2)
    assert epoch.justification == Epoch.Justification.RECONCILED_NOT_COMMITTED
    admission = EpochAdmission.objects.get(epoch=epoch)
    assert admission.decision == OperatorDecision.objects.get(action="retry")
    command.refresh_from_db()
    assert command.state == State.PENDING
    command_dispatch(command_id=command.pk)
    command.refresh_from_db()
    assert command.state == State.COMMITTED
    assert len(remote.refunds()) == 1


def test_query_effect_is_refused_for_an_adapter_that_cannot_answer(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = unknown_message(runtime, reviewer, remote)

    response = act(ops, command, "query-effect")

    assert "cannot be asked about an effect" in refused(ops, response, command)
    assert not OperatorDecision.objects.exists()


def test_reconcile_by_hand_needs_a_note_an_outcome_and_evidence(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = unknown_message(runtime, reviewer, remote)

    assert (
        act(ops, command, "reconcile", note="", outcome="committed", evidence="x").status_code
        == 422
    )
    assert act(ops, command, "reconcile", outcome="maybe", evidence="x").status_code == 422
    assert act(ops, command, "reconcile", outcome="committed", evidence=" ").status_code == 422
    assert not OperatorDecision.objects.exists()

    response = act(
        ops, command, "reconcile", outcome="committed", evidence="https://mail.example/1"
    )

    assert response.status_code == 302
    command.refresh_from_db()
    assert command.state == State.RECONCILED
    decision = OperatorDecision.objects.get()
    assert (decision.finding, decision.evidence) == ("committed", "https://mail.example/1")


def test_accept_ambiguity_admits_a_linked_epoch_and_delivers_again_with_the_same_key(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client, operator: Any
) -> None:
    command = unknown_message(runtime, reviewer, remote)

    response = act(ops, command, "accept-ambiguity", note="customer says nothing arrived")

    assert response.status_code == 302
    epoch = Epoch.objects.get(occurrence_id=command.occurrence_id, number=2)
    assert epoch.justification == Epoch.Justification.AMBIGUITY_ACCEPTED
    admission = EpochAdmission.objects.get(epoch=epoch)
    assert admission.decision is not None and admission.decision.action == "accept_ambiguity"
    assert admission.decided_by == operator.username
    command_dispatch(command_id=command.pk)
    command.refresh_from_db()
    assert command.state == State.COMMITTED
    messages = remote.messages()
    assert len(messages) == 2, "the accepted duplicate"
    assert {m["idempotency_key"] for m in messages} == {command.idempotency_key}
    # The approval stays consumed.
    assert Approval.objects.get(occurrence_id=command.occurrence_id).state == "consumed"


def test_compensate_reverses_a_committed_refund_through_the_adapter(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk)

    response = act(ops, command, "compensate", note="refunded twice by hand")

    assert response.status_code == 302
    command.refresh_from_db()
    assert command.state == State.COMPENSATED
    [refund] = remote.refunds()
    assert refund["status"] == "reversed"
    decision = OperatorDecision.objects.get(action="compensate")
    assert decision.evidence == refund["reversal_id"]
    assert AdapterInvocation.objects.filter(command=command, kind="compensate").count() == 1


def test_compensate_by_hand_records_its_evidence(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = unknown_message(runtime, reviewer, remote)
    act(ops, command, "reconcile", outcome="committed", evidence="msg in outbox")

    response = act(ops, command, "compensate", manual_evidence="apology sent, ticket 88")

    assert response.status_code == 302
    command.refresh_from_db()
    assert command.state == State.COMPENSATED


def test_a_decision_the_state_no_longer_allows_is_refused_with_the_new_state(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client, tenant: Any
) -> None:
    """Two operators on one decision: the second sees what the first did."""
    command = unknown_message(runtime, reviewer, remote)
    other = make_user("oona", tenant, Membership.Role.OPERATOR)
    second = Client()
    second.login(username=other.username, password=PASSWORD)

    first = act(ops, command, "reconcile", outcome="not_committed", evidence="no mail sent")
    late = act(second, command, "accept-ambiguity", note="resend it")

    assert first.status_code == 302
    page = refused(second, late, command)
    assert "Refused: the effect is now reconciled" in page
    assert OperatorDecision.objects.count() == 1
    assert Epoch.objects.filter(occurrence_id=command.occurrence_id).count() == 1


def test_a_retry_is_refused_when_the_effect_was_reconciled_as_committed(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = unknown_message(runtime, reviewer, remote)
    act(ops, command, "reconcile", outcome="committed", evidence="receipt 9")

    response = act(ops, command, "retry")

    assert "would duplicate it" in refused(ops, response, command)


def test_an_unknown_action_is_404(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = unknown_message(runtime, reviewer, remote)
    assert act(ops, command, "delete").status_code == 404


def test_the_queue_lists_the_oldest_and_says_how_many_more_wait(
    runtime: Runtime, reviewer: Any, ops: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_selectors, "QUEUE_LIMIT", 2)
    oldest, middle, newest = (
        _expired_unclaimed(runtime, reviewer, f"e{n}", minutes)
        for n, minutes in enumerate((30, 20, 10))
    )
    page = ops.get("/operations/").content.decode()
    assert "<strong>3</strong> approval expired unclaimed" in page
    assert oldest in page and middle in page and newest not in page
    assert "The oldest 2 are listed; 1 more waits behind them." in page
    only = ops.get("/operations/?reason=expired_unclaimed").content.decode()
    assert "1 more waits behind them" in only
    assert "more wait" not in ops.get("/operations/?reason=outcome_unknown").content.decode()


def test_the_queue_asks_only_for_the_rows_of_reasons_with_items(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    with CaptureQueriesContext(connection) as empty:
        assert "Nothing needs a person" in ops.get("/operations/").content.decode()
    _expired_unclaimed(runtime, reviewer, "e1", 5)
    with CaptureQueriesContext(connection) as one:
        page = ops.get("/operations/").content.decode()
    assert "<strong>1</strong> approval expired unclaimed" in page
    # The same counts, then one reason's rows (with their current proposals), no others.
    assert len(one) == len(empty) + 2
    rows = [
        q["sql"]
        for q in one.captured_queries
        if q["sql"].startswith("SELECT") and "LIMIT" in q["sql"]
    ]
    assert len([sql for sql in rows if re.search(r'FROM "?approvals_approval"?', sql)]) == 1
    assert not [sql for sql in rows if re.search(r'FROM "?approvals_command"? x', sql)]


# --- what an operator's call keeps when its decision is refused -----------------------------


def _reversals(remote: SandboxProcess) -> list[dict[str, Any]]:
    return [r for r in remote.requests() if r["path"].endswith("/reversal")]


def _refund_sent_by_a_worker_that_died(runtime: Runtime, reviewer: Any, remote: Any) -> Command:
    """A refund whose delivery died after phase 1 while the remote made the refund."""
    command = claim_command(runtime, reviewer)
    begin(command_id=command.pk)
    remote.client.post(
        "/v1/refunds",
        json={"payment_id": "pay_123", "amount_minor": 8000, "currency": "EUR", "reason": "x"},
        headers={
            "Authorization": f"Bearer {remote.api_key}",
            "Idempotency-Key": command.idempotency_key,
        },
    )
    return command


def test_a_query_answer_that_arrives_after_the_state_moved_is_kept_on_its_invocation(
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    ops: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another operator accepts the ambiguity while the adapter is asked: the query's
    decision is refused, but its answer stays on its invocation, finished, and the next
    delivery does not close it as abandoned by a dead worker."""
    command = _refund_sent_by_a_worker_that_died(runtime, reviewer, remote)
    [refund] = remote.refunds()
    real_query = PaymentsAdapter.query_effect

    def meanwhile(adapter: PaymentsAdapter, call: Any) -> Any:
        answer = real_query(adapter, call)
        command_accept_ambiguity(command_id=command.pk, operator="oona", note="resend it")
        return answer

    monkeypatch.setattr(PaymentsAdapter, "query_effect", meanwhile)

    response = act(ops, command, "query-effect")

    assert "its answer is kept on the invocation" in refused(ops, response, command)
    query = AdapterInvocation.objects.get(command=command, justification="operator_query")
    assert query.finished_at is not None
    assert (query.outcome, query.receipt) == ("committed", refund["id"])
    assert list(OperatorDecision.objects.values_list("action", flat=True)) == ["accept_ambiguity"]

    command_dispatch(command_id=command.pk)  # the accepted epoch's delivery

    query.refresh_from_db()
    assert (query.outcome, query.receipt) == ("committed", refund["id"]), "not abandoned"
    dead = AdapterInvocation.objects.get(command=command, number=1)
    assert dead.outcome == "abandoned", "the call whose worker did die"


def test_a_reversal_the_remote_refused_keeps_its_answer_and_leaves_nothing_open(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk)
    remote.fault("declined")

    refusal = act(ops, command, "compensate", note="refunded twice by hand")

    failed = AdapterInvocation.objects.get(command=command, kind="compensate")
    assert failed.finished_at is not None
    assert failed.outcome == "rejected" and "402 declined" in failed.detail
    page = refused(ops, refusal, command)
    assert "The adapter did not confirm the reversal: 402 declined" in page
    assert "the effect is still committed" in page
    command.refresh_from_db()
    assert command.state == State.COMMITTED
    assert not OperatorDecision.objects.exists()

    again = act(ops, command, "compensate", note="the processor is back")

    assert again.status_code == 302, "no call left open blocks the next compensation"
    command.refresh_from_db()
    assert command.state == State.COMPENSATED
    calls = AdapterInvocation.objects.filter(command=command, kind="compensate")
    assert [(c.number, c.outcome) for c in calls] == [(2, "rejected"), (3, "committed")]
    [refund] = remote.refunds()
    assert refund["status"] == "reversed"


def test_a_second_compensation_while_one_is_out_is_refused_with_the_state(
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    ops: Client,
    tenant: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk)
    second = Client()
    second.force_login(make_user("oona", tenant, Membership.Role.OPERATOR))
    real_compensate = PaymentsAdapter.compensate
    meanwhile: list[Any] = []

    def while_out(adapter: PaymentsAdapter, call: Any, receipt: str) -> Any:
        meanwhile.append(act(second, command, "compensate", note="me too"))
        meanwhile.append(act(second, command, "compensate", manual_evidence="done by phone"))
        return real_compensate(adapter, call, receipt)

    monkeypatch.setattr(PaymentsAdapter, "compensate", while_out)

    first = act(ops, command, "compensate")

    assert first.status_code == 302
    for response in meanwhile:
        assert response.status_code == 302
    # Both refusals are said on the timeline the second operator is sent back to.
    page = refused(second, meanwhile[0], command)
    assert page.count("a compensation of this effect is already in progress (invocation 2") == 2
    assert "The effect is still committed. Nothing was recorded." in page
    assert len(_reversals(remote)) == 1
    assert list(OperatorDecision.objects.values_list("operator", flat=True)) == ["otto"]


def test_a_compensation_left_unfinished_by_a_dead_request_is_given_up_and_its_answer_kept(
    remote: SandboxProcess,
    runtime: Runtime,
    reviewer: Any,
    ops: Client,
    tenant: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past OPERATIONS_STUCK_SECONDS an open compensation belongs to a request that died:
    another operator may compensate. If the first answer still arrives, it is added to the
    given-up call, and its decision is refused: the effect moved meanwhile."""
    settings.OPERATIONS_STUCK_SECONDS = 0
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk)
    second = Client()
    second.force_login(make_user("oona", tenant, Membership.Role.OPERATOR))
    real_compensate = PaymentsAdapter.compensate
    meanwhile: list[Any] = []
    calls = iter(range(2))

    def slow(adapter: PaymentsAdapter, call: Any, receipt: str) -> Any:
        if next(calls) == 0:  # the first call hangs while the second operator compensates
            meanwhile.append(act(second, command, "compensate", note="it hangs: again"))
        return real_compensate(adapter, call, receipt)

    monkeypatch.setattr(PaymentsAdapter, "compensate", slow)

    late = act(ops, command, "compensate")

    assert meanwhile[0].status_code == 302
    assert "changed to compensated meanwhile" in refused(ops, late, command)
    given_up, done = AdapterInvocation.objects.filter(command=command, kind="compensate")
    [refund] = remote.refunds()
    assert given_up.outcome == "abandoned" and given_up.finished_at is not None
    assert "the request that made it died" in given_up.detail
    assert (
        f"the answer arrived after the call was given up: committed, receipt "
        f"{refund['reversal_id']}" in given_up.detail
    )
    assert (done.outcome, done.receipt) == ("committed", refund["reversal_id"])
    command.refresh_from_db()
    assert command.state == State.COMPENSATED
    assert list(OperatorDecision.objects.values_list("operator", flat=True)) == ["oona"]


# --- the state a decision was made on ----------------------------------------------------------

_SEEN_STATE = re.compile(r'name="seen_state" value="([^"]*)"')


def shown_state(client: Client, command: Command) -> str:
    page = client.get(f"/operations/occurrences/{command.occurrence_id}/").content.decode()
    values = set(_SEEN_STATE.findall(page))
    assert len(values) == 1, "every decision's form names the state the page shows"
    return values.pop()


def test_a_decision_made_on_a_page_another_decision_overtook_is_refused(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client, tenant: Any
) -> None:
    """Both operators see the outcome unknown. The first accepts the ambiguity, and the new
    delivery ends unknown again: the same effect, in another epoch. The second's reconcile,
    decided on the old page, is refused and the page shows what is there now."""
    command = unknown_message(runtime, reviewer, remote)
    second = Client()
    second.force_login(make_user("oona", tenant, Membership.Role.OPERATOR))
    seen = shown_state(ops, command)
    assert seen == shown_state(second, command) == "outcome_unknown:1"

    accepted = act(ops, command, "accept-ambiguity", seen_state=seen)
    assert accepted.status_code == 302
    remote.fault("timeout_after_effect")
    command_dispatch(command_id=command.pk)
    command.refresh_from_db()
    assert command.state == State.OUTCOME_UNKNOWN

    late = act(
        second, command, "reconcile", outcome="not_committed", evidence="no mail", seen_state=seen
    )

    page = refused(second, late, command)
    assert "Refused: the effect is now outcome unknown (epoch 2), not what your page showed" in page
    assert shown_state(second, command) == "outcome_unknown:2", "the page as it is now"
    assert list(OperatorDecision.objects.values_list("action", flat=True)) == ["accept_ambiguity"]
    command.refresh_from_db()
    assert command.state == State.OUTCOME_UNKNOWN


def test_a_decision_on_the_state_shown_goes_through_and_an_unreadable_one_is_422(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = unknown_message(runtime, reviewer, remote)

    unreadable = act(
        ops, command, "reconcile", outcome="committed", evidence="m", seen_state="x' or 1=1"
    )
    assert unreadable.status_code == 422
    assert "did not say which state it was shown" in unreadable.content.decode()

    response = act(
        ops,
        command,
        "reconcile",
        outcome="committed",
        evidence="msg_1",
        seen_state=shown_state(ops, command),
    )

    assert response.status_code == 302
    command.refresh_from_db()
    assert command.state == State.RECONCILED
