"""The review page shows what the outside world did with the approved command: sending,
committed with its receipt, rejected, outcome unknown and why, interrupted with the
challenge as received; and the history lists each call."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals.models import Command
from reconciliation.dispatch import begin, command_dispatch
from tests.conftest import PASSWORD, Runtime
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation.conftest import claim_command

pytestmark = pytest.mark.django_db


def page_of(reviewer: Any, command: Command) -> str:
    client = Client()
    assert client.login(username=reviewer.username, password=PASSWORD)
    response = client.get(f"/reviews/{command.occurrence_id}/")
    assert response.status_code == 200
    return response.content.decode()


def panel_of(reviewer: Any, command: Command) -> str:
    client = Client()
    assert client.login(username=reviewer.username, password=PASSWORD)
    response = client.get(f"/reviews/{command.occurrence_id}/panel", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    return response.content.decode()


def test_a_committed_refund_shows_its_receipt_and_each_call_in_the_history(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk)
    [refund] = remote.refunds()

    page = page_of(reviewer, command)

    assert "Committed: the remote did it." in page
    assert refund["id"] in page
    assert "1 adapter call" in page
    assert "effect.sending" in page.replace('<span class="kind-part">', "").replace("</span>", "")
    assert page.count(refund["id"]) >= 2, "in the panel and in the history's details"


def test_a_sending_command_says_a_call_may_be_in_flight(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)
    begin(command_id=command.pk)

    panel = panel_of(reviewer, command)

    assert "Sending: a call to the adapter may be in flight." in panel


def test_an_unknown_outcome_says_why_and_that_an_operator_must_act(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer, "send_message")
    remote.fault("timeout_after_effect")
    command_dispatch(command_id=command.pk)

    page = page_of(reviewer, command)

    assert "Outcome unknown" in page
    assert "until an operator reconciles it" in page
    assert "ReadTimeout" in page
    assert "effect--attention" in page


def test_an_auth_challenge_is_shown_verbatim_and_inert(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any
) -> None:
    command = claim_command(runtime, reviewer)
    remote.fault("unauthorized")
    command_dispatch(command_id=command.pk)

    page = page_of(reviewer, command)

    assert "Interrupted: the remote asked for authentication" in page
    # Escaped, inside an hx-disable region: the remote's text is data, never markup.
    assert "Bearer realm=&quot;payments&quot;, error=&quot;invalid_token&quot;" in page
    effect = page[page.index('id="effect"') - 80 :]
    assert "hx-disable" in effect[:200]


def test_a_runtime_executed_command_waits_for_the_runtime(runtime: Runtime, reviewer: Any) -> None:
    command = claim_command(runtime, reviewer, "close_case")

    assert "Waiting for the runtime to execute it and report the effect." in page_of(
        reviewer, command
    )
    assert "The agent runtime" in page_of(reviewer, command)
