"""One table decides which decisions the timeline offers and which the server refuses: the
page never offers what the server would refuse, its withheld forms are not there to fill
in, and a refusal is a redirect back to the timeline (post/redirect/get)."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from django.test import Client

from approvals.models import Command
from reconciliation.action_rules import ALLOWED_FROM, allowed_actions, why_not
from reconciliation.dispatch import command_dispatch
from reconciliation.models import OperatorDecision
from tests.conftest import PASSWORD, Runtime
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation.conftest import claim_command

pytestmark = pytest.mark.django_db

State = Command.State
Action = OperatorDecision.Action
Finding = OperatorDecision.Finding

_FORM = re.compile(r'<form id="action-([a-z-]+)"')


@pytest.fixture
def ops(operator: Any) -> Client:
    client = Client()
    assert client.login(username=operator.username, password=PASSWORD)
    return client


def offered(client: Client, command: Command) -> list[str]:
    page = client.get(f"/operations/occurrences/{command.occurrence_id}/").content.decode()
    return _FORM.findall(page)


def unknown_message(runtime: Runtime, reviewer: Any, remote: SandboxProcess) -> Command:
    command = claim_command(runtime, reviewer, "send_message")
    remote.fault("timeout_after_effect")
    command_dispatch(command_id=command.pk)
    command.refresh_from_db()
    assert command.state == State.OUTCOME_UNKNOWN
    return command


def test_the_table_allows_a_retry_only_of_an_effect_found_not_committed() -> None:
    def open_now(finding: str) -> list[str]:
        return allowed_actions(state=State.RECONCILED, finding=finding, adapter="payments")

    assert open_now(Finding.COMMITTED) == [Action.COMPENSATE]
    assert open_now(Finding.NOT_COMMITTED) == [Action.RETRY]
    assert why_not(
        Action.RETRY, state=State.RECONCILED, finding=Finding.COMMITTED, adapter="payments"
    ) == ("The effect was reconciled as committed: a retry would duplicate it.")


def test_the_table_never_opens_an_action_outside_the_states_it_starts_from() -> None:
    findings = ("", Finding.COMMITTED, Finding.NOT_COMMITTED)
    for state, finding, adapter in itertools.product(State, findings, ("payments", "messages")):
        for action in allowed_actions(state=state, finding=finding, adapter=adapter):
            assert state in ALLOWED_FROM[action], (state, action)
    assert Action.QUERY_EFFECT not in allowed_actions(
        state=State.OUTCOME_UNKNOWN, finding="", adapter="messages"
    ), "the messages adapter cannot be asked"


def test_after_reconciled_as_committed_retry_is_not_offered_and_its_post_redirects(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = unknown_message(runtime, reviewer, remote)
    assert offered(ops, command) == ["reconcile", "accept-ambiguity"]

    ops.post(
        f"/operations/commands/{command.pk}/reconcile",
        {"note": "seen in the log", "outcome": "committed", "evidence": "log 7"},
    )

    page = ops.get(f"/operations/occurrences/{command.occurrence_id}/").content.decode()
    assert _FORM.findall(page) == ["compensate"]
    # Withheld: not a disabled form whose note could still be typed in, only why.
    assert page.count("<textarea") == 1
    assert "<strong>Retry</strong>: The effect was reconciled as committed" in page
    assert " disabled" not in page

    response = ops.post(f"/operations/commands/{command.pk}/retry", {"note": "again"})

    timeline = f"/operations/occurrences/{command.occurrence_id}/"
    assert (response.status_code, response["Location"]) == (302, timeline)
    after = ops.get(timeline).content.decode()
    assert re.search(r'id="operator-notice"[^>]*role="alert"[^>]*>[^<]*would duplicate it', after)
    assert list(OperatorDecision.objects.values_list("action", flat=True)) == ["reconcile"]
    # Said once: the reload shows the page without the refusal, and sends nothing.
    assert 'id="operator-notice"' not in ops.get(timeline).content.decode()


def test_a_settled_effect_offers_only_a_compensation(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk)
    assert offered(ops, command) == ["compensate"]
    ops.post(f"/operations/commands/{command.pk}/compensate", {"note": "customer asked"})
    page = ops.get(f"/operations/occurrences/{command.occurrence_id}/").content.decode()
    assert _FORM.findall(page) == []
    assert "Nothing to decide" in page


def test_the_timeline_reads_before_it_acts_and_says_where_a_settled_effect_stands(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk)

    page = ops.get(f"/operations/occurrences/{command.occurrence_id}/").content.decode()

    assert "Why nothing runs" not in page
    assert "<strong>Where it stands:</strong> The effect is committed: settled" in page
    assert "No interruption: the remote never refused the credential" in page
    assert "Nothing stopped it" not in page
    # The summary and the evidence come first, the decisions after them, beside.
    assert page.index('id="why"') < page.index('class="dimensions"') < page.index('id="actions-h"')


def test_ids_on_the_timeline_lead_to_their_investigation_and_can_be_copied(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk)

    page = ops.get(f"/operations/occurrences/{command.occurrence_id}/").content.decode()

    approval = command.approval
    assert approval is not None
    for value in (str(command.pk), "exec-1", approval.fingerprint):
        assert f'<a href="/investigations/?q={value}"' in page, value
    for copied in ("fact-command", "fact-fingerprint", "fact-key", "fact-receipt"):
        assert f'data-copy="{copied}"' in page and f'id="{copied}"' in page, copied
    assert f'id="investigate-link" href="/investigations/?q={command.occurrence_id}"' in page


def test_the_review_page_links_the_timeline_and_investigate_for_an_operator(
    runtime: Runtime, reviewer: Any, operator: Any, ops: Client, tenant: Any
) -> None:
    from approvals.models import Membership
    from tests.conftest import make_user

    occurrence_id = runtime.propose().json()["occurrence_id"]
    both = make_user("rhea", tenant, Membership.Role.REVIEWER, Membership.Role.OPERATOR)
    client = Client()
    client.force_login(both)

    page = client.get(f"/reviews/{occurrence_id}/").content.decode()

    assert f'id="timeline-link" href="/operations/occurrences/{occurrence_id}/"' in page
    assert f'id="investigate-link" href="/investigations/?q={occurrence_id}"' in page
    assert 'data-copy="occurrence-id"' in page
    only_reviewer = Client()
    only_reviewer.force_login(reviewer)
    page = only_reviewer.get(f"/reviews/{occurrence_id}/").content.decode()
    assert 'id="timeline-link"' not in page and 'id="investigate-link"' not in page


def test_ids_in_an_investigation_lead_to_their_own(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    command = claim_command(runtime, reviewer)
    command_dispatch(command_id=command.pk)
    approval = command.approval
    assert approval is not None

    page = ops.get(f"/investigations/?q={command.occurrence_id}").content.decode()

    assert page.count(f'href="/investigations/?q={approval.fingerprint}"') >= 2  # issuance, chain
    assert page.count(f'href="/investigations/?q={command.pk}"') >= 2
