"""Investigations: one id (token fingerprint, execution, command or occurrence) to the joined
chain of evidence and a verdict. The verdict rules as a pure function, one test per story;
then the five stories produced through the real API and services and told apart by the
page; search by each kind of id, tenants, roles, queries per page, and no raw token shown.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.access import tokens
from approvals.audit.record import audit_record
from approvals.models import Approval, AuditDuplicateDelivery, Command, Membership
from approvals.vocabulary import AuditKind, ClaimDecision
from reconciliation.dispatch import begin, command_dispatch, perform, record
from reconciliation.investigations import page as investigation_page_module
from reconciliation.investigations import reads as investigation_reads
from reconciliation.investigations.access import query_read
from reconciliation.investigations.facts import (
    ApprovalFact,
    CommandFact,
    DecisionFact,
    DeliveryFact,
    EventFact,
    Facts,
    InvocationFact,
)
from reconciliation.investigations.gather import investigation_get
from reconciliation.investigations.verdict import (
    CONTROL_FAILURE,
    CONTROL_WORKING,
    DUPLICATED_AUDIT_DELIVERY,
    HEALTHY_REDELIVERY,
    IDEMPOTENT_EXECUTION_FAILURE,
    STORIES,
    assess,
)
from reconciliation.models import AdapterInvocation
from tests.conftest import PASSWORD, REFUND_ARGS, Runtime, approve, make_runtime, make_user
from tests.demo.sandbox_fixture import SandboxProcess
from tests.reconciliation.conftest import MESSAGE_ARGS

T0 = datetime(2026, 8, 4, 10, 0, tzinfo=UTC)
FP = "0123456789abcdef"
CMD = "11111111-1111-4111-8111-111111111111"
CMD2 = "22222222-2222-4222-8222-222222222222"
OCC = "33333333-3333-4333-8333-333333333333"


# --- the verdict rules, as a pure function ------------------------------------------------

_pk = iter(range(1, 1_000_000))


def event(kind: str = "claim.approved", **fields: Any) -> EventFact:
    values: dict[str, Any] = {
        "pk": next(_pk),
        "event_id": str(uuid.uuid4()),
        "kind": kind,
        "tenant_id": 1,
        "source_time": T0,
        "fingerprint": FP,
        "decision": kind.removeprefix("claim.") if kind.startswith("claim.") else "",
        "execution_id": "exec-a",
        "command_id": CMD,
        "occurrence_id": OCC,
    }
    values.update(fields)
    return EventFact(**values)


def approval(**fields: Any) -> ApprovalFact:
    values: dict[str, Any] = {
        "tenant_id": 1,
        "occurrence_id": OCC,
        "fingerprint": FP,
        "state": "consumed",
        "consumed_by_execution": "exec-a",
        "command_id": CMD,
        "approver": "rita",
    }
    values.update(fields)
    return ApprovalFact(**values)


def command(**fields: Any) -> CommandFact:
    values: dict[str, Any] = {
        "pk": CMD,
        "tenant_id": 1,
        "occurrence_id": OCC,
        "execution_id": "exec-a",
        "state": "committed",
        "idempotency_key": "cmd_1",
        "fingerprint": FP,
    }
    values.update(fields)
    return CommandFact(**values)


def invocation(number: int, **fields: Any) -> InvocationFact:
    values: dict[str, Any] = {
        "command_id": CMD,
        "number": number,
        "kind": "execute",
        "outcome": "committed",
        "receipt": "re_1",
        "justification": "first_delivery",
    }
    values.update(fields)
    return InvocationFact(**values)


def console_claim(*more: EventFact, state: str = "committed", **facts: Any) -> Facts:
    """One approval claimed by exec-a through this console, its command committed once."""
    return Facts(
        approvals=(approval(),),
        commands=(command(state=state),),
        invocations=facts.pop("invocations", (invocation(1),)),
        events=(event(), *more),
        events_total=1 + len(more),
        **facts,
    )


def test_a_normal_flow_is_named_with_what_it_counts_and_every_story_says_what_to_do() -> None:
    assessment = assess(console_claim())

    assert assessment.codes == [] and not assessment.gaps
    assert assessment.normal == "Normal: 1 approval → 1 command → 1 effect, committed"
    assert "Nothing to do unless the effect itself is wrong" in assessment.summary
    waiting = assess(console_claim(state="pending", invocations=()))
    assert waiting.normal == "Normal: 1 approval → 1 command → 0 effects, not sent"
    for code, story in STORIES.items():
        assert story.next_step.endswith(".") and story.next_step.count(". ") == 0, code
    working = assess(console_claim(event("claim.replayed", execution_id="b", command_id="")))
    assert working.codes == [CONTROL_WORKING] and working.normal == ""


def test_control_working_one_approved_execution_and_replays_denied() -> None:
    facts = console_claim(
        event(
            "claim.replayed",
            execution_id="exec-b",
            command_id="",
            reason_code="consumed_by_other_execution",
        ),
        event("claim.replayed", execution_id="exec-c", command_id=""),
    )

    assessment = assess(facts)

    assert assessment.codes == [CONTROL_WORKING]
    [verdict] = assessment.verdicts
    text = " ".join(verdict.facts)
    assert "approved once, for execution exec-a" in text
    assert "2 attempts by other executions refused as replayed" in text
    assert "exec-b" in text and "exec-c" in text
    assert "No second command was created." in text
    assert not assessment.gaps


def test_many_replays_list_the_first_five_and_count_the_rest() -> None:
    replays = [event("claim.replayed", execution_id=f"exec-r{n}", command_id="") for n in range(7)]
    [verdict] = assess(console_claim(*replays)).verdicts

    [line] = [fact for fact in verdict.facts if "refused as replayed" in fact]
    assert line.startswith("7 attempts by other executions refused as replayed: exec-r0 at ")
    assert "exec-r4 at" in line and "exec-r5" not in line
    assert line.endswith("; and 2 more.")


def test_healthy_redelivery_one_execution_several_deliveries_one_command() -> None:
    facts = console_claim(
        event("claim.duplicate_delivery", message_id="m-2"),
        event(
            "dispatch.redelivered",
            fingerprint="",
            decision="ignored",
            reason_code="already_committed",
            message_id="q-2",
        ),
        invocations=(invocation(1, message_id="q-1"),),
    )

    assessment = assess(facts)

    assert assessment.codes == [HEALTHY_REDELIVERY]
    text = " ".join(assessment.verdicts[0].facts)
    assert (
        "Execution exec-a claimed the token twice: approved once, then duplicate_delivery once"
        in text
    )
    assert "delivered command 11111111 again once (dispatch.redelivered)" in text
    assert "already committed, so nothing was called" in text
    assert "Queue message ids: m-2, q-1, q-2." in text
    assert "the adapter was called once; effect committed, receipt re_1" in text


def test_a_resumed_delivery_under_the_contract_is_a_healthy_redelivery() -> None:
    facts = console_claim(
        invocations=(
            invocation(1, outcome="abandoned", receipt="", message_id="q-1"),
            invocation(2, kind="query", justification="effect_queryable", message_id="q-2"),
        )
    )

    assessment = assess(facts)

    assert assessment.codes == [HEALTHY_REDELIVERY]
    assert "effect_queryable" in " ".join(assessment.verdicts[0].facts)


def test_duplicated_audit_delivery_one_producer_event_ingested_twice() -> None:
    stored = event(
        "approval_decision", decision="approved", ingestion_id=7, ingested_at=T0, command_id=CMD2
    )
    facts = Facts(
        events=(stored,),
        deliveries=(
            DeliveryFact(stored.pk, stored.event_id, 8, T0 + timedelta(minutes=1), 1, True),
        ),
        events_total=1,
    )

    assessment = assess(facts)

    assert assessment.codes == [DUPLICATED_AUDIT_DELIVERY]
    text = " ".join(assessment.verdicts[0].facts)
    assert f"Producer event {stored.event_id}" in text and "delivered twice" in text
    assert "stored once from batch #7" in text and "batch #8" in text and "same content" in text
    assert not assessment.gaps


def test_a_duplicate_delivery_with_other_content_names_the_producer() -> None:
    stored = event("approval_decision", decision="approved", ingestion_id=7)
    facts = Facts(
        events=(stored,),
        deliveries=(DeliveryFact(stored.pk, stored.event_id, 8, T0, 3, False),),
        events_total=1,
    )

    text = " ".join(assess(facts).verdicts[0].facts)

    assert "different content" in text and "reused an event id" in text


def test_idempotent_execution_failure_two_receipts_under_one_key() -> None:
    facts = console_claim(
        invocations=(
            invocation(1, outcome="abandoned", receipt="msg_A", message_id="q-1"),
            invocation(2, receipt="msg_B", justification="epoch_admitted"),
        ),
        decisions=(DecisionFact(CMD, "accept_ambiguity", "otto", created_at=T0),),
    )

    assessment = assess(facts)

    assert assessment.codes == [IDEMPOTENT_EXECUTION_FAILURE]
    text = " ".join(assessment.verdicts[0].facts)
    assert "2 distinct receipts under one key" in text and "cmd_1" in text
    assert "msg_A" in text and "msg_B" in text
    assert "asked to execute it twice" in text
    assert "Invocation 1 was given up as abandoned, yet its answer arrived later" in text
    assert "otto accepted the ambiguity" in text


def test_idempotent_execution_failure_from_committed_events_with_different_receipts() -> None:
    facts = console_claim(
        event("effect.committed", fingerprint="", decision="committed", receipt="re_1"),
        event("effect.committed", fingerprint="", decision="committed", receipt="re_2"),
        invocations=(),
    )

    assert assess(facts).codes == [IDEMPOTENT_EXECUTION_FAILURE]


def test_the_same_receipt_again_is_the_key_working_not_a_failure() -> None:
    facts = console_claim(
        invocations=(
            invocation(1, outcome="abandoned", receipt="", message_id="q-1"),
            invocation(2, kind="query", receipt="re_1", justification="effect_queryable"),
        )
    )

    assert IDEMPOTENT_EXECUTION_FAILURE not in assess(facts).codes


def test_control_failure_one_fingerprint_two_approved_executions() -> None:
    """The console's own audit trail records a second approved execution (what a broken
    guard would write): that is a control failure."""
    other = event("claim.approved", execution_id="exec-z", command_id=CMD2)
    facts = console_claim(other)

    assessment = assess(facts)

    assert assessment.codes == [CONTROL_FAILURE]
    text = " ".join(assessment.verdicts[0].facts)
    assert f"Fingerprint {FP} has approved decisions for 2 executions: exec-a, exec-z" in text
    assert "written by this console" in text
    assert "2 commands came of it" in text
    assert "The approval row is consumed by exec-a only; the approval of exec-z is in the " in text
    assert not assessment.conflicts


def test_another_producers_approval_of_a_console_approval_is_a_conflict_not_a_verdict() -> None:
    """A runtime key ingests claim.approved with this console's fingerprint and another
    execution: its word is shown, with the producer named, and the verdict rests on the
    console's own records (one approved execution)."""
    other = event(
        "claim.approved", execution_id="exec-z", command_id=CMD2, ingestion_id=4, occurrence_id=""
    )
    facts = dataclasses.replace(console_claim(other), producers={4: "legacy-worker"})

    assessment = assess(facts)

    assert assessment.codes == []
    assert assessment.summary.startswith("None of the five stories")
    assert "contradict this console's records" in assessment.summary
    assert assessment.tone == "warn"
    [conflict] = assessment.conflicts
    assert conflict.title == "An external producer reports a second approved execution"
    assert conflict.producer == "runtime key “legacy-worker”"
    assert conflict.facts[:2] == (
        f"This console's own records admit exec-a for fingerprint {FP}.",
        f"Runtime key “legacy-worker” reports fingerprint {FP} approved for exec-z "
        f"(claim.approved, producer event {other.event_id[:8]}, batch #4).",
    )


def test_another_producer_agreeing_with_the_console_is_no_conflict() -> None:
    same = event("approval_decision", decision="approved", ingestion_id=4, command_id=CMD)
    replayed = event("claim.replayed", execution_id="exec-b", command_id="", ingestion_id=4)

    assessment = assess(console_claim(same, replayed))

    assert assessment.codes == [], "its replays are no evidence of the console's control"
    assert not assessment.conflicts


def test_another_producers_approval_of_an_unclaimed_console_approval_is_a_conflict() -> None:
    facts = Facts(
        approvals=(approval(state="issued", consumed_by_execution="", command_id=""),),
        events=(event("approval_decision", decision="approved", ingestion_id=2),),
        events_total=1,
    )

    assessment = assess(facts)

    assert assessment.codes == []
    assert f"No claim of fingerprint {FP} is recorded" in " ".join(assessment.gaps)
    [conflict] = assessment.conflicts
    assert conflict.title == (
        "An external producer reports an approved execution this console never admitted"
    )
    assert conflict.producer == "an unnamed producer (batch #2)"
    assert f"This console's own records admit no execution for fingerprint {FP}." in conflict.facts


def test_another_producers_claims_about_a_console_command_are_conflicts_not_verdicts() -> None:
    """Named by command id alone (no fingerprint): a second approved execution, and an
    effect committed with another receipt, neither turned into a verdict."""
    facts = dataclasses.replace(
        console_claim(
            event("approval_decision", decision="approved", fingerprint="", ingestion_id=5),
            event(
                "approval_decision",
                decision="approved",
                fingerprint="",
                execution_id="exec-q",
                ingestion_id=5,
            ),
            event(
                "effect.committed",
                fingerprint="",
                decision="committed",
                receipt="re_9",
                ingestion_id=5,
            ),
        ),
        producers={5: "shipper"},
    )

    assessment = assess(facts)

    assert assessment.codes == []
    approved, receipt = assessment.conflicts
    assert approved.title == "An external producer reports a second approved execution"
    assert "This console's own records admit exec-a for command 11111111." in approved.facts
    assert any("approved for exec-q" in fact for fact in approved.facts)
    assert receipt.title == "An external producer reports an effect this console did not record"
    assert receipt.facts[:2] == (
        "This console recorded command 11111111's effect with receipt re_1.",
        f"Runtime key “shipper” reports it committed with receipt re_9 "
        f"(effect.committed, producer event {facts.events[3].event_id[:8]}, batch #5).",
    )


def test_control_failure_from_another_producer_alone() -> None:
    facts = Facts(
        events=(
            event("approval_decision", decision="approved", execution_id="exec-1", ingestion_id=1),
            event("approval_decision", decision="approved", execution_id="exec-2", ingestion_id=1),
        ),
        events_total=2,
    )

    assert assess(facts).codes == [CONTROL_FAILURE]


def test_a_duplicated_delivery_of_an_approval_is_not_a_second_execution() -> None:
    """The article's trap: approved rows = 2 for one decision delivered twice."""
    first = event("approval_decision", decision="approved", ingestion_id=1)
    facts = Facts(
        events=(first,),
        deliveries=(DeliveryFact(first.pk, first.event_id, 2, T0, 1, True),),
        events_total=1,
    )

    assert assess(facts).codes == [DUPLICATED_AUDIT_DELIVERY]


def test_several_verdicts_are_listed_worst_first() -> None:
    stored = event("claim.replayed", execution_id="exec-b", command_id="", ingestion_id=9)
    facts = console_claim(
        event("approval_decision", decision="approved", execution_id="exec-z", command_id=CMD2),
        stored,
        deliveries=(DeliveryFact(stored.pk, stored.event_id, 10, T0, 1, True),),
        invocations=(invocation(1), invocation(2, receipt="re_2")),
    )

    assessment = assess(facts)

    assert assessment.codes == [
        CONTROL_FAILURE,
        IDEMPOTENT_EXECUTION_FAILURE,
        DUPLICATED_AUDIT_DELIVERY,
    ]
    assert assessment.tone == "alarm"
    assert assessment.summary.startswith("One approval authorized more than one execution")
    assert "Also: idempotent execution failure, duplicated audit delivery." in assessment.summary


def test_insufficient_evidence_is_said_plainly() -> None:
    unnamed = Facts(
        events=(event("approval_decision", decision="approved", execution_id=""),),
        events_total=1,
    )
    not_claimed = Facts(
        approvals=(approval(state="issued", consumed_by_execution="", command_id=""),)
    )
    unknown = console_claim(
        state="outcome_unknown", invocations=(invocation(1, outcome="outcome_unknown", receipt=""),)
    )

    for facts, gap in (
        (unnamed, "name no execution"),
        (not_claimed, "No claim of fingerprint 0123456789abcdef is recorded"),
        (unknown, "is outcome unknown: whether the adapter acted"),
    ):
        assessment = assess(facts)
        assert assessment.insufficient, assessment
        assert "evidence is insufficient" in assessment.summary
        assert any(gap in line for line in assessment.gaps), assessment.gaps


def test_only_refused_claims_are_insufficient_for_a_verdict() -> None:
    facts = Facts(
        events=(
            event("claim.unknown_token", command_id="", occurrence_id=""),
            event("claim.unknown_token", command_id="", occurrence_id="", execution_id="x"),
        ),
        events_total=2,
    )

    assessment = assess(facts)

    assert assessment.insufficient
    assert assessment.gaps == (
        "No claim here was approved (2 unknown_token): no execution was authorized, so "
        "there is no replay or redelivery to judge.",
    )


def test_an_accepted_ambiguity_without_a_second_receipt_is_a_gap_not_a_verdict() -> None:
    facts = console_claim(
        invocations=(
            invocation(1, outcome="outcome_unknown", receipt=""),
            invocation(2, receipt="msg_B", justification="epoch_admitted"),
        ),
        decisions=(DecisionFact(CMD, "accept_ambiguity", "otto"),),
    )

    assessment = assess(facts)

    assert assessment.codes == []
    assert any("neither proven nor ruled out" in gap for gap in assessment.gaps)


def test_a_truncated_chain_says_so() -> None:
    facts = console_claim(event("claim.replayed", execution_id="exec-b"))
    facts = dataclasses.replace(facts, events_total=900)

    assessment = assess(facts)

    assert assessment.codes == [CONTROL_WORKING]
    assert any("The chain has 900 audit events" in gap for gap in assessment.gaps)


def test_a_clean_single_claim_is_none_of_the_stories() -> None:
    assessment = assess(console_claim())

    assert assessment.codes == [] and not assessment.gaps
    assert assessment.summary.startswith("None of the five stories")


def test_a_raw_token_is_never_searched_for_itself() -> None:
    read = query_read("  apv_" + "x" * 43 + " ")
    assert read.q == "" and len(read.fingerprint_of_token) == 16
    assert query_read("rk_" + "y" * 40).refusal
    assert query_read("z" * 201).refusal
    assert query_read(" exec-a ").q == "exec-a"
    assert query_read("apv_runner-1").q == "apv_runner-1", "too short to be a token"


# --- the five stories, through the real API and services ----------------------------------

VERDICT = re.compile(r'data-verdict="([a-z_]+)"')


@pytest.fixture
def ops(operator: Any) -> Client:
    client = Client()
    assert client.login(username=operator.username, password=PASSWORD)
    return client


def investigate(client: Client, q: str) -> tuple[int, str]:
    response = client.get("/investigations/", {"q": q})
    return response.status_code, response.content.decode()


def page_of(client: Client, q: str) -> str:
    status, page = investigate(client, q)
    assert status == 200, (q, status)
    return page


def verdicts(page: str) -> list[str]:
    return VERDICT.findall(page)


@dataclass
class Story:
    occurrence_id: str
    fingerprint: str
    command_id: str
    token: str


def claimed(
    runtime: Runtime,
    reviewer: Any,
    execution_id: str,
    *,
    tool: str = "issue_refund",
    arguments: dict[str, Any] | None = None,
    ref: str = "",
    message_id: str = "",
) -> Story:
    """Propose, approve, pick up the token once and claim it for ``execution_id``."""
    arguments = dict(REFUND_ARGS if arguments is None else arguments)
    fields = {"client_ref": ref} if ref else {}
    proposed = runtime.propose(tool=tool, arguments=arguments, **fields)
    assert proposed.status_code == 201, proposed.content
    occurrence_id = proposed.json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    token = runtime.token(occurrence_id).json()["token"]
    extra = {"message_id": message_id} if message_id else {}
    claim = runtime.claim(token, execution_id, tool=tool, arguments=arguments, **extra)
    assert claim.status_code == 200 and claim.json()["decision"] == "approved", claim.content
    fingerprint = Approval.objects.get(occurrence_id=occurrence_id).fingerprint
    return Story(occurrence_id, fingerprint, claim.json()["command_id"], token)


def ingest(producer: Runtime, *lines: dict[str, Any]) -> Any:
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    response = producer.client.post(
        "/api/v1/audit/events", body, content_type="application/x-ndjson"
    )
    assert response.status_code == 200, response.content
    return response.json()


def producer_line(**fields: Any) -> dict[str, Any]:
    return {
        "event_id": str(uuid.uuid4()),
        "kind": "approval_decision",
        "fingerprint": "feedface00000001",
        "decision": "approved",
        "execution_id": "exec-x",
        "message_id": "msg-x",
        "command_id": str(uuid.uuid4()),
        "source_time": "2026-08-04T10:00:00.000000Z",
        **fields,
    }


def control_working(runtime: Runtime, reviewer: Any, ref: str = "cw") -> Story:
    story = claimed(runtime, reviewer, "exec-a", ref=ref, message_id="m-a")
    replay = runtime.claim(story.token, "exec-b", message_id="m-b")
    assert replay.status_code == 403 and replay.json()["decision"] == "replayed"
    return story


@pytest.mark.django_db
def test_story_control_working(runtime: Runtime, reviewer: Any, ops: Client) -> None:
    story = control_working(runtime, reviewer)

    status, page = investigate(ops, story.fingerprint)

    assert status == 200
    assert verdicts(page) == [CONTROL_WORKING]
    assert "1 attempt by other executions refused as replayed: exec-b" in page
    assert story.command_id in page and "claim.replayed" in page and "claim.approved" in page
    assert story.token not in page


@pytest.mark.django_db
def test_story_healthy_redelivery(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    story = claimed(runtime, reviewer, "exec-h", message_id="m-1")
    again = runtime.claim(story.token, "exec-h", message_id="m-2")
    assert again.json()["decision"] == "duplicate_delivery"
    command_dispatch(command_id=story.command_id, message_id="q-1")
    command_dispatch(command_id=story.command_id, message_id="q-2")  # the broker again
    assert len(remote.refunds()) == 1

    page = page_of(ops, story.fingerprint)

    assert verdicts(page) == [HEALTHY_REDELIVERY]
    assert "Execution exec-h claimed the token twice" in page
    assert "dispatch.redelivered" in page and "already committed, so nothing was called" in page
    for message in ("m-1", "m-2", "q-1", "q-2"):
        assert message in page
    [refund] = remote.refunds()
    assert refund["id"] in page, "the one receipt"


@pytest.mark.django_db
def test_story_duplicated_audit_delivery(runtime: Runtime, tenant: Any, ops: Client) -> None:
    producer = make_runtime(tenant, "log-shipper")
    line = producer_line()
    assert ingest(producer, line)["new"] == 1
    assert ingest(producer, line)["duplicates"] == 1, "the sink delivered it again"

    page = page_of(ops, line["fingerprint"])

    assert verdicts(page) == [DUPLICATED_AUDIT_DELIVERY]
    assert f"Producer event {line['event_id']}" in page and "delivered twice" in page
    assert "delivered \u00d72" in page
    delivery = AuditDuplicateDelivery.objects.get()
    assert f"batch #{delivery.ingestion_id}" in page


@pytest.mark.django_db
def test_story_idempotent_execution_failure(
    remote: SandboxProcess, runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    """An unsafe webhook whose first call hangs; an operator accepts the ambiguity while it
    is in flight; the command is delivered again and both calls reach the receiver, which
    does not deduplicate: two messages under one idempotency key."""
    story = claimed(
        runtime, reviewer, "exec-w", tool="send_message", arguments=MESSAGE_ARGS, message_id="m-w"
    )
    slow = begin(command_id=story.command_id, message_id="q-1")
    answer = perform(slow)  # the receiver took it; the worker has not recorded it yet
    response = ops.post(
        f"/operations/commands/{story.command_id}/accept-ambiguity",
        {"note": "the customer says nothing arrived"},
    )
    assert response.status_code == 302
    command_dispatch(command_id=story.command_id, message_id="q-2")
    record(slow, answer)  # the first worker comes back: a late result
    assert len(remote.messages()) == 2
    receipts = set(
        AdapterInvocation.objects.filter(command_id=story.command_id).values_list(
            "receipt", flat=True
        )
    )
    assert len(receipts) == 2

    page = page_of(ops, story.command_id)

    assert verdicts(page) == [IDEMPOTENT_EXECUTION_FAILURE]
    assert "2 distinct receipts under one key" in page
    for receipt in receipts:
        assert receipt in page
    assert "otto accepted the ambiguity" in page


def approved_again_by_a_broken_guard(story: Story, execution_id: str) -> None:
    """A second claim.approved in the console's own audit trail, as a claim whose guard did
    not hold would write it."""
    approval_row = Approval.objects.get(occurrence_id=story.occurrence_id)
    audit_record(
        kind=AuditKind.CLAIM_APPROVED,
        tenant=approval_row.tenant_id,
        occurrence=approval_row.occurrence_id,
        token_fingerprint=story.fingerprint,
        decision=ClaimDecision.APPROVED,
        reason_code="claimed",
        execution_id=execution_id,
        command_id=uuid.uuid4(),
    )


@pytest.mark.django_db
def test_story_control_failure(runtime: Runtime, reviewer: Any, ops: Client) -> None:
    story = claimed(runtime, reviewer, "exec-a", ref="cf")
    approved_again_by_a_broken_guard(story, "exec-z")

    page = page_of(ops, story.fingerprint)

    assert verdicts(page) == [CONTROL_FAILURE]
    assert "approved decisions for 2 executions: exec-a, exec-z" in page
    assert "The approval row is consumed by exec-a only" in page
    assert 'id="verdict-conflicts"' not in page


@pytest.mark.django_db
def test_story_another_producer_reports_a_second_approved_execution(
    runtime: Runtime, reviewer: Any, tenant: Any, ops: Client
) -> None:
    """A runtime key ingests claim.approved with a real approval's fingerprint and another
    execution id: no control failure on its word, a conflict naming it instead."""
    story = claimed(runtime, reviewer, "exec-a", ref="cf")
    other_system = make_runtime(tenant, "legacy-worker")
    ingest(
        other_system,
        producer_line(kind="claim.approved", fingerprint=story.fingerprint, execution_id="exec-z"),
    )

    page = page_of(ops, story.fingerprint)

    assert verdicts(page) == []
    assert "Verdict: Normal: 1 approval → 1 command → " in page
    conflicts = page[page.index('id="verdict-conflicts"') :]
    assert "An external producer reports a second approved execution" in conflicts
    assert "runtime key “legacy-worker”" in conflicts
    assert f"This console&#x27;s own records admit exec-a for fingerprint {story.fingerprint}" in (
        conflicts
    )
    assert "approved for exec-z" in conflicts
    assert Command.objects.count() == 1, "the console itself created one command"


@pytest.mark.django_db
def test_the_five_stories_are_told_apart(
    runtime: Runtime, reviewer: Any, tenant: Any, ops: Client
) -> None:
    """All five in one tenant at once: each fingerprint gets its own verdict only."""
    working = control_working(runtime, reviewer, ref="s1")
    healthy = claimed(runtime, reviewer, "exec-h", ref="s2")
    runtime.claim(healthy.token, "exec-h")
    failure = claimed(runtime, reviewer, "exec-f", ref="s3")
    approved_again_by_a_broken_guard(failure, "exec-g")
    producer = make_runtime(tenant, "producer")
    duplicated = producer_line(fingerprint="d0d0d0d0d0d0d0d0")
    ingest(producer, duplicated)
    ingest(producer, duplicated)

    assert verdicts(investigate(ops, working.fingerprint)[1]) == [CONTROL_WORKING]
    assert verdicts(investigate(ops, healthy.fingerprint)[1]) == [HEALTHY_REDELIVERY]
    assert verdicts(investigate(ops, failure.fingerprint)[1]) == [CONTROL_FAILURE]
    assert verdicts(investigate(ops, "d0d0d0d0d0d0d0d0")[1]) == [DUPLICATED_AUDIT_DELIVERY]


# --- searching ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_search_by_each_kind_of_id_finds_the_same_chain(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    story = control_working(runtime, reviewer)

    for q in (story.fingerprint, "exec-a", "exec-b", story.command_id, story.occurrence_id):
        status, page = investigate(ops, q)
        assert status == 200, q
        assert verdicts(page) == [CONTROL_WORKING], q
        assert story.fingerprint in page and story.command_id in page, q
        assert f"/operations/occurrences/{story.occurrence_id}/" in page, q
        assert "m-a" in page and "m-b" in page, "the queue message ids"


@pytest.mark.django_db
def test_the_events_are_read_as_the_verdict_reads_them(tenant: Any) -> None:
    """Ids as str(uuid) (on PostgreSQL the database writes them), none as "", and a
    receipt only where an effect event's payload names one as a string."""
    from approvals.models import AuditEvent
    from reconciliation.investigations.gather import investigation_get

    command_id = uuid.uuid4()
    written = [
        AuditEvent.objects.create(
            tenant=tenant,
            kind=kind,
            token_fingerprint=FP,
            execution_id="exec-r",
            command_id=command,
            source_time=T0,
            data={"receipt": receipt},
        )
        for kind, command, receipt in (
            ("effect.committed", command_id, "re_9"),
            ("effect.committed", command_id, 5),  # not a string: no receipt
            ("claim.approved", None, "re_x"),  # not an effect: no receipt
        )
    ]

    found = investigation_get(q=FP, tenant_ids=[tenant.pk])

    by_pk = {e.pk: e for e in found.facts.events}
    assert sorted(by_pk) == sorted(e.pk for e in written)
    committed, numbered, claim = (by_pk[e.pk] for e in written)
    assert committed.event_id == str(written[0].event_id)
    assert (committed.command_id, committed.occurrence_id) == (str(command_id), "")
    assert (committed.receipt, numbered.receipt, claim.receipt) == ("re_9", "", "")
    assert claim.command_id == "" and claim.ingestion_id is None
    assert committed.source_time == T0 and committed.ingested_at is not None
    assert all(type(value) is not uuid.UUID for e in by_pk.values() for value in e)


@pytest.mark.django_db
def test_nothing_found_says_so(ops: Client) -> None:
    status, page = investigate(ops, "no-such-thing")
    assert status == 200
    assert "Nothing found" in page and "no-such-thing" in page
    assert verdicts(page) == []


@pytest.mark.django_db
def test_an_unknown_tokens_fingerprint_is_found_and_judged_insufficient(
    runtime: Runtime, ops: Client
) -> None:
    bogus = "apv_" + "q" * 43
    assert runtime.claim(bogus, "exec-probe").json()["decision"] == "unknown_token"

    page = page_of(ops, tokens.fingerprint(bogus))

    assert "Verdict: the evidence is insufficient" in page
    assert "No claim here was approved (1 unknown_token)" in page
    assert "exec-probe" in page and bogus not in page


@pytest.mark.django_db
def test_an_empty_search_shows_the_box(ops: Client) -> None:
    response = ops.get("/investigations/")
    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="investigate-form"' in page and 'id="verdict"' not in page


@pytest.mark.django_db
def test_a_raw_token_is_replaced_by_its_fingerprint_and_never_shown(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    story = control_working(runtime, reviewer)

    response = ops.get("/investigations/", {"q": story.token})

    assert response.status_code == 302
    assert story.token not in response["Location"]
    assert f"q={story.fingerprint}" in response["Location"]
    page = ops.get(response["Location"]).content.decode()
    assert story.token not in page
    assert "replaced by its fingerprint" in page
    assert verdicts(page) == [CONTROL_WORKING]


@pytest.mark.django_db
def test_no_raw_token_on_any_page(runtime: Runtime, reviewer: Any, ops: Client) -> None:
    stories = [control_working(runtime, reviewer, ref=f"t{n}") for n in range(2)]
    for story in stories:
        for q in (story.fingerprint, story.command_id, story.occurrence_id, "exec-a"):
            page = investigate(ops, q)[1]
            for other in stories:
                assert other.token not in page
                assert other.token[4:20] not in page


# --- tenants and roles ----------------------------------------------------------------------


@pytest.mark.django_db
def test_nothing_of_another_tenant_is_found(
    runtime: Runtime, other_runtime: Runtime, reviewer: Any, other_tenant: Any, ops: Client
) -> None:
    ours = control_working(runtime, reviewer)
    other_reviewer = make_user("olga", other_tenant, Membership.Role.REVIEWER)
    theirs = control_working(other_runtime, other_reviewer)
    ingest(other_runtime, producer_line(fingerprint=theirs.fingerprint, execution_id="exec-a"))

    named = {theirs.fingerprint, theirs.command_id, theirs.occurrence_id}
    for q in named:
        status, page = investigate(ops, q)
        assert status == 200 and "Nothing found" in page, q
        assert verdicts(page) == []
        for other in named - {q}:
            assert other not in page, (q, other)
    # The same execution id in both tenants: only ours.
    page = investigate(ops, "exec-a")[1]
    assert ours.occurrence_id in page and ours.fingerprint in page
    assert theirs.occurrence_id not in page and theirs.fingerprint not in page
    assert verdicts(page) == [CONTROL_WORKING]


@pytest.mark.django_db
def test_an_operator_of_two_tenants_sees_both_each_named(
    runtime: Runtime, other_runtime: Runtime, reviewer: Any, other_tenant: Any, operator: Any
) -> None:
    Membership.objects.create(user=operator, tenant=other_tenant, role=Membership.Role.OPERATOR)
    ours = control_working(runtime, reviewer)
    theirs = control_working(
        other_runtime, make_user("olga", other_tenant, Membership.Role.REVIEWER)
    )
    client = Client()
    client.login(username=operator.username, password=PASSWORD)

    page = page_of(client, "exec-a")

    assert ours.occurrence_id in page and theirs.occurrence_id in page
    assert ">Acme<" in page and ">Globex<" in page
    assert verdicts(page) == [CONTROL_WORKING]
    assert f"Fingerprint {ours.fingerprint} was approved once" in page
    assert f"Fingerprint {theirs.fingerprint} was approved once" in page


@pytest.mark.django_db
def test_operators_and_admins_investigate_reviewers_are_refused(
    client: Client, runtime: Runtime, reviewer: Any, operator: Any, tenant: Any
) -> None:
    story = control_working(runtime, reviewer)
    url = f"/investigations/?q={story.fingerprint}"

    assert client.get(url).status_code == 302  # sign in first
    client.login(username=reviewer.username, password=PASSWORD)
    assert client.get(url).status_code == 403

    client.login(username=operator.username, password=PASSWORD)
    page = client.get(url).content.decode()
    assert verdicts(page) == [CONTROL_WORKING]
    assert f"/operations/occurrences/{story.occurrence_id}/" in page
    assert 'href="/investigations/" aria-current="page">Investigate</a>' in page
    assert 'aria-current="page">Operations</a>' not in page
    queue = client.get("/operations/").content.decode()
    assert 'href="/investigations/">Investigate</a>' in queue

    admin = make_user("ada", tenant, Membership.Role.ADMIN)
    client.login(username=admin.username, password=PASSWORD)
    page = client.get(url).content.decode()
    assert verdicts(page) == [CONTROL_WORKING]
    # An admin who is no operator reads the occurrence on its review page.
    assert f"/reviews/{story.occurrence_id}/" in page
    assert f"/operations/occurrences/{story.occurrence_id}/" not in page
    inbox = client.get("/reviews/").content.decode()
    assert 'href="/investigations/">Investigate</a>' in inbox


@pytest.mark.django_db
def test_reviewers_see_no_investigate_link(client: Client, reviewer: Any) -> None:
    client.login(username=reviewer.username, password=PASSWORD)
    assert ">Investigate</a>" not in client.get("/reviews/").content.decode()


@pytest.mark.django_db
def test_the_page_answers_get_and_its_search_post_only(ops: Client) -> None:
    assert ops.put("/investigations/", {"q": "x"}).status_code == 405
    assert ops.delete("/investigations/").status_code == 405


# --- the search box: a POST, so that what was typed is in no address and no log ---------------


def _search_form(page: str) -> str:
    form = page[page.index('<form id="investigate-form"') :]
    return form[: form.index("</form>")]


@pytest.mark.django_db
def test_a_search_is_posted_and_redirected_to_an_address_that_names_no_token(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    story = control_working(runtime, reviewer)
    form = _search_form(ops.get("/investigations/").content.decode())
    assert 'method="post"' in form and 'name="csrfmiddlewaretoken"' in form

    pasted = ops.post("/investigations/", {"q": f" {story.token} "})

    assert pasted.status_code == 302
    assert pasted["Location"] == f"/investigations/?q={story.fingerprint}"
    page = ops.get(pasted["Location"]).content.decode()
    assert "replaced by its fingerprint" in page and story.token not in page
    assert verdicts(page) == [CONTROL_WORKING]
    by_id = ops.post("/investigations/", {"q": story.command_id})
    assert by_id["Location"] == f"/investigations/?q={story.command_id}"
    assert verdicts(ops.get(by_id["Location"]).content.decode()) == [CONTROL_WORKING]


@pytest.mark.django_db
def test_a_posted_runtime_key_or_nothing_goes_back_to_the_empty_box(
    runtime: Runtime, ops: Client
) -> None:
    key = ops.post("/investigations/", {"q": runtime.raw_key})

    assert (key.status_code, key["Location"]) == (302, "/investigations/")
    page = ops.get(key["Location"]).content.decode()
    assert "That looks like a runtime key" in page and runtime.raw_key not in page
    assert ops.post("/investigations/", {"q": "  "})["Location"] == "/investigations/"
    # Every other secret the console issues, posted or in an address: never searched for,
    # never redirected into ?q= (an access log would keep it).
    for secret, word in [
        ("pat_" + "A1b2" * 10, "access token"),
        ("whsec_" + "c3D4" * 10, "callback signing secret"),
    ]:
        for send in (ops.post, ops.get):
            response = send("/investigations/", {"q": secret})
            assert (response.status_code, response["Location"]) == (302, "/investigations/")
            page = ops.get(response["Location"]).content.decode()
            assert word in page and secret not in page


@pytest.mark.django_db
def test_a_search_without_its_csrf_token_is_refused(operator: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.login(username=operator.username, password=PASSWORD)

    assert client.post("/investigations/", {"q": "exec-a"}).status_code == 403


@pytest.mark.django_db
def test_the_title_shows_the_query_revealed_as_the_page_does(ops: Client) -> None:
    """A U+202E in the query would reorder the page's title in the tab and the history."""
    page = page_of(ops, "exec-\u202egnp.exe")

    [title] = re.findall(r"<title>(.*?)</title>", page, re.S)
    assert title == "Investigate exec-\\u202egnp.exe · Approval console"
    nothing = page[page.index('id="verdict"') :]
    assert "\u202e" not in nothing and "\\u202e" in nothing
    [long_title] = re.findall(r"<title>(.*?)</title>", page_of(ops, "x" * 30))
    assert long_title == f"Investigate {'x' * 23}… · Approval console"


# --- queries per page -------------------------------------------------------------------------


@pytest.mark.django_db
def test_queries_do_not_grow_with_rows(
    runtime: Runtime, reviewer: Any, tenant: Any, ops: Client
) -> None:
    story = control_working(runtime, reviewer)
    producer = make_runtime(tenant, "producer")
    line = producer_line(
        fingerprint=story.fingerprint, execution_id="exec-a", command_id=story.command_id
    )
    ingest(producer, line, line)
    searches = (story.fingerprint, story.command_id, story.occurrence_id, "exec-a")
    investigate(ops, "warm-up")
    few = {}
    for q in searches:
        with CaptureQueriesContext(connection) as queries:
            assert investigate(ops, q)[0] == 200
        few[q] = len(queries)

    for n in range(6):
        runtime.claim(story.token, f"exec-r{n}", message_id=f"m-r{n}")
        runtime.claim(story.token, "exec-a", message_id=f"m-d{n}")
        ingest(producer, line)
        ingest(
            producer,
            producer_line(
                fingerprint=story.fingerprint, execution_id="exec-a", command_id=story.command_id
            ),
        )
        AdapterInvocation.objects.create(
            command_id=story.command_id,
            epoch=Command.objects.get(pk=story.command_id).epoch,
            number=n + 1,
            kind="query",
            justification="effect_queryable",
            started_at=T0,
        )

    for q in searches:
        with CaptureQueriesContext(connection) as queries:
            status, page = investigate(ops, q)
        assert status == 200
        assert "exec-r5" in page and "m-d5" in page
        assert len(queries) == few[q], q


# --- the chain's rows (the investigation page's chain-row and chain-gap partials) ------------


def chain_row(row: Any, show_tenant: bool, every_step_url: str = "") -> str:
    """One row of the investigation's chain, as its page renders it."""
    from approvals.web.jinja import render_rows

    context = {
        "rows": [row],
        "show_tenant": show_tenant,
        "every_step_url": every_step_url,
        "investigate_url": "/investigations/",
    }
    return render_rows("reconciliation/chain_rows.html", context).strip()


def test_a_chain_row_escapes_what_producers_wrote_and_marks_each_kind_of_step() -> None:
    from django.utils.safestring import SafeString

    from approvals.web.text import reveal_html
    from reconciliation.investigations.page import ChainRow

    at = datetime(2026, 12, 1, 9, 8, 7, 654321, tzinfo=UTC)
    event = ChainRow(
        at=at,
        kind="claim.replayed",
        outcome="replayed · consumed_by_other_execution",
        fingerprint="fp_1234abcd",
        execution=reveal_html('exec-<script>alert("x")</script>'),
        message=SafeString(""),
        command_id="0ea770c8-cc7d-4189-83d0-c9e8587e8a09",
        event_id="evt-<1>",
        origin="runtime <key>",
        deliveries=3,
        flag="security",
        tenant="Acme & Co",
    )
    html = chain_row(event, show_tenant=True)
    assert html.startswith(
        '<tr class="chain-row chain-row--security" data-event-id="evt-&lt;1&gt;">'
    )
    assert (
        '<td class="nowrap">09:08:07.654 <span class="muted small">2026-12-01</span></td>' in html
    )
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert '<td><code class="agent-text small">—</code></td>' in html  # no message id
    assert (
        '<code class="mono small"><a href="/investigations/?q=0ea770c8-cc7d-4189-83d0-c9e8587e8a09"'
        ' title="Investigate command 0ea770c8-cc7d-4189-83d0-c9e8587e8a09">0ea770c8…</a></code>'
        in html
    )
    assert 'runtime &lt;key&gt; <span class="flag flag--duplicate">delivered \u00d73</span>' in html
    assert html.endswith("<td>Acme &amp; Co</td></tr>")

    invocation = dataclasses.replace(
        event, event_id="", fingerprint="", command_id="", deliveries=1, flag="", outcome=""
    )
    html = chain_row(invocation, show_tenant=False)
    assert html.startswith('<tr class="chain-row">')
    assert '<span class="muted small">adapter row</span>' in html
    assert '<td><code class="codes">—</code></td>' in html
    assert html.count('<span class="muted">—</span>') == 2  # fingerprint, command
    assert "delivered" not in html and "Acme" not in html


# --- a long chain: the newest steps and the decisive ones, the rest summarized -------------


def test_a_long_chain_shows_its_newest_steps_and_every_decisive_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reconciliation.investigations.gather import Investigation
    from reconciliation.investigations.page import ChainGap, chain_rows

    monkeypatch.setattr(investigation_page_module, "CHAIN_WINDOW", 3)
    at = [T0 + timedelta(seconds=n) for n in range(11)]
    replays = [
        event("claim.replayed", execution_id=f"exec-r{n}", source_time=at[n]) for n in range(11)
    ]
    steps = [
        event(source_time=at[0]),  # the approved claim, the oldest step
        *replays[1:5],
        event("effect.committed", decision="", receipt="re_1", source_time=at[5]),
        replays[6],  # delivered twice
        *replays[7:],
    ]
    again = DeliveryFact(replays[6].pk, replays[6].event_id, 7, T0, 1, True)
    found = Investigation(
        "q", Facts(events=tuple(steps), deliveries=(again,), events_total=11), [], [], [], False
    )

    chain = chain_rows(found, {})

    shape = [
        f"gap {row.hidden}: {row.kinds}" if isinstance(row, ChainGap) else row.execution
        for row in chain.rows
    ]
    assert shape == [
        "exec-a",  # approved: shown however old
        "gap 4: 4 claim.replayed",
        "exec-a",  # the effect
        "exec-r6",  # delivered twice
        "gap 1: 1 claim.replayed",
        "exec-r8",  # the newest three
        "exec-r9",
        "exec-r10",
    ]
    assert (chain.steps, chain.shown, chain.hidden) == (11, 6, 5)
    assert [row.flag for row in chain.rows if not isinstance(row, ChainGap)][:3] == [
        "approved",
        "effect",
        "duplicate",
    ]

    every = chain_rows(found, {}, every_step=True)
    assert (every.steps, every.shown, every.hidden) == (11, 11, 0)
    assert not any(isinstance(row, ChainGap) for row in every.rows)


def test_a_gap_names_at_most_three_kinds() -> None:
    from collections import Counter

    from reconciliation.investigations.page import _kinds

    kinds = Counter({"claim.replayed": 7, "claim.expired": 2, "claim.revoked": 2, "x": 1})
    assert _kinds(kinds) == "7 claim.replayed, 2 claim.expired, 2 claim.revoked, 1 of other kinds"


def test_a_gap_row_says_what_it_hides_and_links_to_every_step() -> None:
    from reconciliation.investigations.page import ChainGap

    gap = ChainGap(4, "3 claim.replayed, 1 <b>odd</b>")
    html = chain_row(gap, False, "/investigations/?q=a&steps=all#chain-h")
    assert html == (
        '<tr class="chain-gap"><td colspan="9"><strong>4 earlier steps not shown</strong> '
        '<span class="muted">(3 claim.replayed, 1 &lt;b&gt;odd&lt;/b&gt;)</span>. '
        '<a href="/investigations/?q=a&amp;steps=all#chain-h">Show every step</a></td></tr>'
    )
    assert 'colspan="10"' in chain_row(ChainGap(1, "1 x"), True, "")
    assert "1 earlier step not shown" in chain_row(ChainGap(1, "1 x"), True, "")


def _chain_table(page: str) -> str:
    start = page.index('id="chain-h"')
    return page[start : page.index("</table>", start)]


@pytest.mark.django_db
def test_the_page_shows_a_long_chain_in_a_window_and_every_step_on_request(
    runtime: Runtime, reviewer: Any, ops: Client, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(investigation_page_module, "CHAIN_WINDOW", 3)
    story = control_working(runtime, reviewer)
    for n in range(8):
        assert runtime.claim(story.token, f"exec-r{n}").json()["decision"] == "replayed"

    with CaptureQueriesContext(connection) as windowed:
        status, page = investigate(ops, story.fingerprint)
    assert status == 200
    assert verdicts(page) == [CONTROL_WORKING]
    # The verdict counts every replay read, whatever the chain shows.
    assert "9 attempts by other executions refused as replayed" in page
    chain = _chain_table(page)
    assert "claim.approved" in chain  # the decisive step, however old
    assert "exec-r7" in chain and "exec-r6" in chain and "exec-r5" in chain  # the newest 3
    assert "exec-r4" not in chain and "exec-b" not in chain
    gap = re.search(r"<strong>(\d+) earlier steps not shown</strong>", chain)
    assert gap is not None and "claim.replayed" in chain
    shown = re.search(r"(\d+) of (\d+) steps shown", page)
    assert shown is not None
    assert int(shown.group(1)) + int(gap.group(1)) <= int(shown.group(2))
    every_url = f"/investigations/?q={story.fingerprint}&amp;steps=all#chain-h"
    assert every_url in page

    with CaptureQueriesContext(connection) as every:
        response = ops.get("/investigations/", {"q": story.fingerprint, "steps": "all"})
    assert response.status_code == 200
    chain = _chain_table(response.content.decode())
    assert "exec-r4" in chain and "exec-b" in chain and "not shown" not in chain
    assert "Every step read is shown" in response.content.decode()
    assert len(every) == len(windowed)  # showing more steps reads nothing more


# --- a chain longer than the events read ----------------------------------------------------


@pytest.mark.django_db
def test_past_the_events_read_the_verdict_still_rests_on_the_decisive_ones(
    runtime: Runtime, reviewer: Any, ops: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest EVENT_LIMIT events are read, and before them every approved claim and
    committed effect (found by their own indexes), and the chain is counted whole; a chain
    that fits is neither counted nor searched twice."""

    story = control_working(runtime, reviewer)
    with CaptureQueriesContext(connection) as short:
        assert investigate(ops, story.fingerprint)[0] == 200
    assert not [q for q in short.captured_queries if q["sql"].startswith("SELECT COUNT(*)")]

    monkeypatch.setattr(investigation_reads, "EVENT_LIMIT", 4)
    for n in range(6):
        runtime.claim(story.token, f"exec-r{n}", message_id=f"m-r{n}")
    with CaptureQueriesContext(connection) as long:
        status, page = investigate(ops, story.fingerprint)
    assert status == 200
    assert verdicts(page) == [CONTROL_WORKING]
    # The approved claim is older than the four newest events, and still what it rests on.
    assert f"Fingerprint {story.fingerprint} was approved once, for execution exec-a" in page
    # Twelve events: the four newest read, and the approved claim before them.
    assert "The chain has 12 audit events; this reads the newest 4 and every approved" in page
    assert len(long.captured_queries) == len(short.captured_queries) + 2  # decisive, count

    # The events read are the chain's four newest (each once, whichever ways the chain
    # names it: by fingerprint, by occurrence) and, before them, only decisive ones.
    tenant_ids = [runtime.key.tenant_id]
    read = investigation_get(q=story.fingerprint, tenant_ids=tenant_ids).facts
    monkeypatch.setattr(investigation_reads, "EVENT_LIMIT", 1000)
    whole = investigation_get(q=story.fingerprint, tenant_ids=tenant_ids).facts
    assert (read.events_newest, read.events_total, len(whole.events)) == (4, 12, 12)
    newest = sorted(e.pk for e in whole.events)[-4:]
    assert sorted(e.pk for e in read.events)[-4:] == newest
    older = [e for e in read.events if e.pk < newest[0]]
    assert older and all(e.decision == "approved" or e.kind == "effect.committed" for e in older)


@pytest.mark.django_db
def test_a_counts_tooltip_names_the_first_twenty(
    runtime: Runtime, reviewer: Any, ops: Client
) -> None:
    story = control_working(runtime, reviewer)
    for n in range(25):
        runtime.claim(story.token, f"exec-r{n:02d}")

    page = page_of(ops, story.fingerprint)

    # exec-a, exec-b and 25 replaying executions: 27 in all.
    [title] = re.findall(r'<li title="([^"]*)"><strong>27</strong> executions</li>', page)
    assert title.count(", ") == 20
    assert title.endswith(", and 7 more")


def test_the_investigations_sql_reads_answer_as_their_orm_twins(
    runtime: Runtime, reviewer: Any, approved: str, token: str
) -> None:
    """On PostgreSQL an investigation reads through plain SQL; SQLite runs the ORM twins
    (``reads_orm``). For chains named every way (a fingerprint, an execution, an
    occurrence id, a command id), both read the same rows in the same order."""
    from django.db import connection

    from reconciliation.investigations import reads, reads_orm

    if connection.vendor != "postgresql":
        pytest.skip("the SQL reads run on PostgreSQL only")
    assert runtime.claim(token, "exec-1").status_code == 200
    assert runtime.claim(token, "exec-2").status_code == 403  # a replay
    command = Command.objects.get(occurrence_id=approved)
    fingerprint = Approval.objects.get(occurrence_id=approved).fingerprint
    mine = [runtime.key.tenant_id]
    occurrences, fingerprints, commands = [uuid.UUID(approved)], [fingerprint], [command.pk]

    def row(instance: Any) -> tuple[Any, ...]:
        fields = type(instance)._meta.concrete_fields
        return tuple(getattr(instance, f.attname, None) for f in fields)

    def approvals(found: list[Any]) -> list[Any]:
        return [(*row(a), a.approver.username) for a in found]

    def shown(found: list[Any]) -> list[Any]:
        return [(row(o), o.tool.name, o.tenant.name, o.current_action) for o in found]

    for q, pk in [
        (fingerprint, None),
        ("exec-1", None),
        ("exec-2", None),
        (approved, uuid.UUID(approved)),
        (str(command.pk), command.pk),
    ]:
        for tenants in (mine, [*mine, 999999]):
            assert sorted(map(str, reads.seeds(q=q, pk=pk, tenant_ids=tenants))) == sorted(
                map(str, reads_orm.seeds(q=q, pk=pk, tenant_ids=tenants, limit=200))
            )
            assert sorted(map(str, reads.seed_approvals(q=q, pk=pk, tenant_ids=tenants))) == sorted(
                map(str, reads_orm.seed_approvals(q=q, pk=pk, tenant_ids=tenants, limit=200))
            )
            chain = reads_orm.Chain(q, pk, tenants, occurrences, fingerprints, commands)
            assert reads.newest(chain) == reads_orm.newest(chain, reads.EVENT_LIMIT)
            assert reads.decisive(chain) == reads_orm.decisive(chain, reads.DECISIVE_LIMIT)
            assert reads.count(chain) == reads_orm.count(chain) > 0
            assert approvals(
                reads.approvals(
                    tenant_ids=tenants, occurrence_ids=occurrences, fingerprints=fingerprints
                )
            ) == approvals(
                reads_orm.approvals(
                    tenant_ids=tenants,
                    occurrence_ids=occurrences,
                    fingerprints=fingerprints,
                    limit=200,
                )
            )
            assert shown(
                reads.occurrences(tenant_ids=tenants, occurrence_ids=occurrences)
            ) == shown(reads_orm.occurrences(tenant_ids=tenants, occurrence_ids=occurrences))
            assert [
                row(c)
                for c in reads.commands(
                    tenant_ids=tenants, occurrence_ids=occurrences, command_ids=commands
                )
            ] == [
                row(c)
                for c in reads_orm.commands(
                    tenant_ids=tenants, occurrence_ids=occurrences, command_ids=commands, limit=200
                )
            ]
    assert reads.seed_commands(pk=command.pk, tenant_ids=mine) == reads_orm.seed_commands(
        pk=command.pk, tenant_ids=mine, limit=200
    )
    assert [row(i) for i in reads.invocations(command_ids=commands)] == [
        row(i) for i in reads_orm.invocations(command_ids=commands)
    ]
    assert [row(d) for d in reads.decisions(command_ids=commands)] == [
        row(d) for d in reads_orm.decisions(command_ids=commands)
    ]
