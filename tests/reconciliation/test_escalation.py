"""Escalation: a queue item past its tenant's threshold is told once, signed, to a real
local HTTP receiver (the sandbox's webhook endpoint) and by email; it never acts."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from approvals.audit.record import db_now
from approvals.models import AuditEvent, Command
from reconciliation.credentials import encrypt
from reconciliation.dispatch import command_dispatch
from reconciliation.escalation import escalations_run
from reconciliation.models import Escalation, EscalationPolicy, QueueTake
from reconciliation.takes import occurrence_take
from tests.conftest import Runtime
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation.conftest import claim_command

pytestmark = pytest.mark.django_db


def unknown_for(runtime: Runtime, reviewer: Any, remote: SandboxProcess, minutes: int) -> Command:
    command = claim_command(runtime, reviewer, "send_message")
    remote.fault("timeout_after_effect")
    command_dispatch(command_id=command.pk)
    Command.objects.filter(pk=command.pk).update(
        updated_at=timezone.now() - timedelta(minutes=minutes)
    )
    remote.reset()
    return command


@pytest.fixture
def policy(tenant: Any, remote: SandboxProcess, settings: Any) -> EscalationPolicy:
    # The sandbox listens on loopback, which only an operator's setting lets the
    # escalation webhook reach (as a callback).
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    return EscalationPolicy.objects.create(
        tenant=tenant,
        after_minutes=30,
        webhook_url=f"{remote.url}/v1/messages",
        secret_encrypted=encrypt(remote.webhook_secret),
        email="oncall@example.com",
    )


def test_an_item_past_the_threshold_is_escalated_once_signed(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, policy: EscalationPolicy, settings: Any
) -> None:
    settings.CONSOLE_BASE_URL = "https://console.example.com"
    command = unknown_for(runtime, reviewer, remote, minutes=45)

    assert escalations_run() == 1
    assert escalations_run() == 0, "once"

    [message] = remote.messages()
    body = message["body"]
    assert body["reason"] == "outcome_unknown"
    assert body["occurrence_id"] == str(command.occurrence_id)
    assert body["link"] == (
        f"https://console.example.com/operations/occurrences/{command.occurrence_id}/"
    )
    # Accepted by the sandbox, which verified its Standard Webhooks signature; the older
    # header is still there.
    assert message["webhook_id"] == f"escalation-{Escalation.objects.get().pk}"
    expected = hmac.new(
        remote.webhook_secret.encode(), message["raw_body"].encode(), hashlib.sha256
    )
    assert message["signature"] == f"sha256={expected.hexdigest()}"
    assert json.loads(message["raw_body"]) == body
    [email] = mail.outbox
    assert email.to == ["oncall@example.com"] and body["link"] in email.body
    event = AuditEvent.objects.get(kind="operations.escalated")
    assert (event.decision, event.reason_code) == ("delivered", "outcome_unknown")
    # Escalation never acts: the effect is as it was.
    command.refresh_from_db()
    assert command.state == Command.State.OUTCOME_UNKNOWN


def test_an_item_younger_than_the_threshold_is_not_escalated(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, policy: EscalationPolicy
) -> None:
    unknown_for(runtime, reviewer, remote, minutes=5)

    assert escalations_run() == 0
    assert remote.messages() == [] and mail.outbox == []


def test_a_failed_delivery_is_tried_again_on_the_next_run(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, policy: EscalationPolicy
) -> None:
    unknown_for(runtime, reviewer, remote, minutes=45)
    remote.fault("unavailable")

    assert escalations_run() == 0
    assert Escalation.objects.get().delivered is False
    assert escalations_run() == 1
    assert len(remote.messages()) == 1
    escalation = Escalation.objects.get()
    assert (escalation.delivered, escalation.attempts) == (True, 2)
    decisions = list(
        AuditEvent.objects.filter(kind="operations.escalated")
        .order_by("id")
        .values_list("decision", flat=True)
    )
    assert decisions == ["failed", "delivered"]


def test_a_private_address_is_not_called_unless_the_operator_allows_it(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, policy: EscalationPolicy, settings: Any
) -> None:
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = False
    unknown_for(runtime, reviewer, remote, minutes=45)

    assert escalations_run() == 0

    assert remote.requests() == [] and remote.messages() == []
    escalation = Escalation.objects.get()
    assert escalation.delivered is False
    assert escalation.detail.startswith("webhook failed: ConnectError")


def test_an_item_an_operator_is_on_is_not_escalated_until_the_take_ends(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, policy: EscalationPolicy, operator: Any
) -> None:
    command = unknown_for(runtime, reviewer, remote, minutes=45)
    occurrence_take(
        occurrence_id=command.occurrence_id, tenant_ids=[policy.tenant_id], user=operator
    )

    assert escalations_run() == 0
    assert remote.messages() == [] and not Escalation.objects.exists()

    QueueTake.objects.filter(occurrence_id=command.occurrence_id).update(
        expires_at=db_now() - timedelta(seconds=1)
    )
    assert escalations_run() == 1, "the take lapsed: nobody is on it"
