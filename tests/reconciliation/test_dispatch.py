"""Delivery phases against the real sandbox, in this process: what each remote behaviour
becomes as effect, recovery and authority evidence, and how often the remote was called."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import AuditEvent, Command, Epoch
from reconciliation.credential_refresh import credential_replace
from reconciliation.dispatch import command_dispatch
from reconciliation.models import AdapterInvocation, EpochAdmission, Interruption
from tests.conftest import Runtime
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation.conftest import claim_command

pytestmark = pytest.mark.django_db

State = Command.State
CHALLENGE = 'Bearer realm="payments", error="invalid_token"'


def writes(remote: SandboxProcess) -> list[dict[str, Any]]:
    """The calls that could have an effect: POSTs under /v1."""
    return [r for r in remote.requests() if r["method"] == "POST"]


def kinds(command: Command) -> list[str]:
    return list(
        AuditEvent.objects.filter(command_id=command.pk)
        .order_by("id")
        .values_list("kind", flat=True)
    )


def invocations(command: Command) -> list[tuple[str, str, str]]:
    return list(
        AdapterInvocation.objects.filter(command=command)
        .order_by("number")
        .values_list("kind", "justification", "outcome")
    )


def test_refund_is_executed_once_and_committed_with_its_receipt(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)
    assert command.executed_by == "console"

    command_dispatch(command_id=command.pk, message_id="msg-1")

    command.refresh_from_db()
    assert command.state == State.COMMITTED
    [refund] = remote.refunds()
    assert refund["idempotency_key"] == command.idempotency_key
    assert refund["amount_minor"] == 8000
    assert invocations(command) == [("execute", "first_delivery", "committed")]
    assert AdapterInvocation.objects.get(command=command).receipt == refund["id"]
    assert kinds(command)[-2:] == ["effect.sending", "effect.committed"]
    committed = AuditEvent.objects.get(command_id=command.pk, kind="effect.committed")
    assert committed.data["receipt"] == refund["id"]


def test_a_redelivery_after_the_effect_calls_nothing_and_is_recorded(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk, message_id="msg-1")
    command_dispatch(command_id=command.pk, message_id="msg-1")

    assert len(writes(remote)) == 1
    assert AdapterInvocation.objects.filter(command=command).count() == 1
    redelivery = AuditEvent.objects.get(command_id=command.pk, kind="dispatch.redelivered")
    assert (redelivery.message_id, redelivery.reason_code) == ("msg-1", "already_committed")


@pytest.mark.parametrize("fault", ["timeout_after_effect", "reset_after_effect"])
def test_an_ambiguous_refund_is_resolved_by_the_effect_query(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, fault: str
) -> None:
    command = claim_command(runtime, reviewer)
    remote.fault(fault)

    command_dispatch(command_id=command.pk)

    command.refresh_from_db()
    assert command.state == State.COMMITTED
    assert len(remote.refunds()) == 1
    assert len(writes(remote)) == 1, "the refund was not sent twice"
    assert invocations(command) == [
        ("execute", "first_delivery", "outcome_unknown"),
        ("query", "effect_queryable", "committed"),
    ]
    committed = AuditEvent.objects.get(command_id=command.pk, kind="effect.committed")
    assert committed.reason_code == "effect_queryable"
    assert committed.data["why"] == "the effect query found it"


@pytest.mark.parametrize("fault", ["timeout_after_effect", "reset_after_effect"])
def test_an_ambiguous_message_stops_at_outcome_unknown(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, fault: str
) -> None:
    command = claim_command(runtime, reviewer, "send_message")
    remote.fault(fault)

    command_dispatch(command_id=command.pk)
    command_dispatch(command_id=command.pk)  # a redelivery does not call again

    command.refresh_from_db()
    assert command.state == State.OUTCOME_UNKNOWN
    assert len(remote.messages()) == 1
    assert len(writes(remote)) == 1
    assert invocations(command) == [("execute", "first_delivery", "outcome_unknown")]
    unknown = AuditEvent.objects.get(command_id=command.pk, kind="effect.outcome_unknown")
    assert unknown.reason_code == "ambiguous"


def test_a_message_is_signed_with_the_tenant_secret(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, settings: Any
) -> None:
    import hashlib
    import hmac
    import json

    command = claim_command(runtime, reviewer, "send_message")
    command_dispatch(command_id=command.pk)

    # The sandbox accepted it after verifying its Standard Webhooks signature.
    [message] = remote.messages()
    command.refresh_from_db()
    assert command.state == State.COMMITTED
    assert message["webhook_id"] == command.idempotency_key
    # The older header, an HMAC of the body alone, is still sent for older receivers.
    body = json.dumps(message["body"], sort_keys=True, separators=(",", ":")).encode()
    expected = hmac.new(settings.MESSAGES_WEBHOOK_SECRET.encode(), body, hashlib.sha256)
    assert message["signature"] == f"sha256={expected.hexdigest()}"
    assert message["idempotency_key"] == command.idempotency_key


def test_a_message_signed_with_another_secret_is_refused_by_the_receiver(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, settings: Any
) -> None:
    settings.MESSAGES_WEBHOOK_SECRET = "whsec_" + "B" * 43 + "="
    command = claim_command(runtime, reviewer, "send_message")

    command_dispatch(command_id=command.pk)

    assert remote.messages() == []
    assert [r["status"] for r in writes(remote)] == [401]


def test_a_declined_refund_is_rejected_and_not_retried(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)
    remote.fault("declined")

    plan = command_dispatch(command_id=command.pk)

    command.refresh_from_db()
    assert (command.state, plan.retry_in) == (State.REJECTED, None)
    assert remote.refunds() == []
    assert len(writes(remote)) == 1


def test_an_unavailable_payments_api_is_retried_with_backoff_up_to_the_limit(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)
    remote.fault("unavailable", times=5)

    first = command_dispatch(command_id=command.pk)
    command.refresh_from_db()
    assert command.state == State.PENDING, "nothing happened: back to the outbox"
    assert first.retry_in == 2.0
    second = command_dispatch(command_id=command.pk)
    assert second.retry_in == 4.0
    third = command_dispatch(command_id=command.pk)

    command.refresh_from_db()
    assert (command.state, third.retry_in) == (State.REJECTED, None)
    assert len(writes(remote)) == 3, "max_attempts of the contract"
    assert invocations(command) == [
        ("execute", "first_delivery", "rejected"),
        ("execute", "refused_before_execution", "rejected"),
        ("execute", "refused_before_execution", "rejected"),
    ]


def test_an_auth_challenge_keeps_its_values_and_reissues_nothing(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)
    remote.fault("unauthorized")

    command_dispatch(command_id=command.pk)
    command_dispatch(command_id=command.pk)  # a redelivery changes nothing

    command.refresh_from_db()
    assert command.state == State.REJECTED
    [interruption] = Interruption.objects.filter(command=command)
    assert interruption.challenges == [CHALLENGE]
    assert interruption.resolved_at is None
    assert len(writes(remote)) == 1
    assert Epoch.objects.filter(occurrence_id=command.occurrence_id).count() == 1
    event = AuditEvent.objects.get(command_id=command.pk, kind="recovery.interrupted")
    assert event.data["challenges"] == [CHALLENGE]


def test_a_replaced_credential_admits_one_linked_epoch_and_one_more_call(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    command = claim_command(runtime, reviewer)
    remote.fault("unauthorized")
    command_dispatch(command_id=command.pk)
    interruption = Interruption.objects.get(command=command)

    with django_capture_on_commit_callbacks() as callbacks:
        [epoch] = credential_replace(
            tenant=command.tenant, adapter="payments", secret=remote.api_key, actor="ada"
        )
    assert len(callbacks) == 1, "the command is enqueued again once"

    assert epoch.number == 2
    assert epoch.justification == Epoch.Justification.REJECTED
    assert epoch.previous.number == 1
    admission = EpochAdmission.objects.get(epoch=epoch)
    assert admission.interruption == interruption
    assert admission.decided_by == "policy"
    assert admission.basis == "the earlier call was refused before execution"
    refreshed = AuditEvent.objects.get(kind="credentials.refreshed")
    assert refreshed.actor == "ada" and "secret" not in str(refreshed.data).lower()

    command_dispatch(command_id=command.pk)

    command.refresh_from_db()
    assert command.state == State.COMMITTED
    assert len(writes(remote)) == 2, "the refused call and exactly one more"
    assert len(remote.refunds()) == 1
    assert invocations(command) == [
        ("execute", "first_delivery", "interrupted"),
        ("execute", "epoch_admitted", "committed"),
    ]
    assert list(
        AdapterInvocation.objects.filter(command=command).values_list("epoch__number", flat=True)
    ) == [1, 2]
    interruption.refresh_from_db()
    assert interruption.resolved_at is not None


def test_restored_authority_alone_does_not_replay_an_unknown_effect(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer, "send_message")
    remote.fault("timeout_after_effect")
    command_dispatch(command_id=command.pk)
    # An interruption recorded for the same command (a later 401 seen by the runtime).
    Interruption.objects.create(
        command=command,
        epoch=command.epoch,
        kind=Interruption.Kind.AUTH_CHALLENGE,
        challenges=[CHALLENGE],
    )

    [refusal] = credential_replace(
        tenant=command.tenant, adapter="messages", secret="whsec_new", actor="ada"
    )

    assert refusal.code == "needs_reconciliation"
    assert Epoch.objects.filter(occurrence_id=command.occurrence_id).count() == 1
    command.refresh_from_db()
    assert command.state == State.OUTCOME_UNKNOWN
    assert AuditEvent.objects.filter(kind="epoch.waiting", command_id=command.pk).exists()


def test_a_delivery_that_finds_sending_queries_a_queryable_effect_first(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    """A worker died after phase 1 (before the call): the query finds nothing, so the
    refund is sent under the same key with that justification."""
    command = claim_command(runtime, reviewer)
    from reconciliation.dispatch import begin

    begin(command_id=command.pk, message_id="msg-1")  # phase 1 only, then the worker died

    command_dispatch(command_id=command.pk, message_id="msg-1")

    command.refresh_from_db()
    assert command.state == State.COMMITTED
    assert len(remote.refunds()) == 1
    assert invocations(command) == [
        ("execute", "first_delivery", "abandoned"),
        ("query", "effect_queryable", "not_found"),
        ("execute", "queried_not_found", "committed"),
    ]


def test_a_delivery_that_finds_sending_for_an_unsafe_tool_stops_without_calling(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer, "send_message")
    from reconciliation.dispatch import begin

    begin(command_id=command.pk)

    command_dispatch(command_id=command.pk)

    command.refresh_from_db()
    assert command.state == State.OUTCOME_UNKNOWN
    assert writes(remote) == []
    assert invocations(command) == [("execute", "first_delivery", "abandoned")]


def test_runtime_executed_commands_are_not_dispatched_by_the_console(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer, "close_case")
    assert command.executed_by == "runtime"

    command_dispatch(command_id=command.pk)

    command.refresh_from_db()
    assert command.state == State.PENDING
    assert remote.requests() == []
