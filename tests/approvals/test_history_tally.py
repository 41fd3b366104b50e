"""A history that fits in the review page's window is on the page whole, so its claim
tally and its command's effect line are counted from the events read instead of asked for
again: the same numbers as the database's grouped queries, in every case they count."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.audit.record import audit_record
from approvals.models import AuditEvent, Command, Occurrence
from approvals.vocabulary import AuditKind, ClaimDecision
from approvals.web.selectors.history import claim_tally, claim_tally_of_events
from approvals.web.selectors.review import effect_evidence
from tests.approvals.test_views_html import propose, signed_in
from tests.conftest import Runtime


def _claim(occurrence: Occurrence, decision: str, execution: str, command: Any = None) -> None:
    audit_record(
        kind=AuditKind.for_claim(decision),
        tenant=occurrence.tenant_id,
        occurrence=occurrence,
        decision=decision,
        execution_id=execution,
        command_id=command,
    )


def _events(occurrence: Occurrence) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(occurrence=occurrence).order_by("id"))


def test_the_tally_of_the_events_read_is_the_databases(runtime: Runtime) -> None:
    occurrence = Occurrence.objects.get(pk=propose(runtime))
    first, second = uuid.uuid4(), uuid.uuid4()
    _claim(occurrence, ClaimDecision.REPLAYED, "exec-early")  # before any approval
    _claim(occurrence, ClaimDecision.APPROVED, "exec-a", first)
    _claim(occurrence, ClaimDecision.DUPLICATE_DELIVERY, "exec-a", first)
    _claim(occurrence, ClaimDecision.DUPLICATE_DELIVERY, "exec-a", first)
    for n in range(12):  # more replayers than the evidence line names
        _claim(occurrence, ClaimDecision.REPLAYED, f"exec-r{n % 11}")
    _claim(occurrence, ClaimDecision.REPLAYED, "")  # an unnamed execution is one more
    _claim(occurrence, ClaimDecision.SCOPE_MISMATCH, "exec-s")
    _claim(occurrence, ClaimDecision.EXPIRED, "exec-x")
    # Approvals of other producers: one without a command, one for a second command.
    _claim(occurrence, ClaimDecision.APPROVED, "exec-b")
    _claim(occurrence, ClaimDecision.APPROVED, "exec-c", second)
    _claim(occurrence, ClaimDecision.APPROVED, "exec-c", first)
    _claim(occurrence, ClaimDecision.DUPLICATE_DELIVERY, "exec-b")
    for n in range(11):  # more delivered executions than it names
        _claim(occurrence, ClaimDecision.DUPLICATE_DELIVERY, f"exec-d{n}")

    in_python = claim_tally_of_events(_events(occurrence))
    assert in_python == claim_tally(occurrence)
    assert in_python.replayer_total == 13
    assert in_python.commands == 3


def test_an_empty_tally_too(runtime: Runtime) -> None:
    occurrence = Occurrence.objects.get(pk=propose(runtime))
    assert claim_tally_of_events(_events(occurrence)) == claim_tally(occurrence)


def test_the_effect_line_of_the_events_read_is_the_databases(
    runtime: Runtime, reviewer: Any, token: str, approved: str
) -> None:
    runtime.claim(token, "exec-a")
    occurrence = Occurrence.objects.get(pk=approved)
    command = Command.objects.get(occurrence=occurrence)
    other = uuid.uuid4()

    def effect(kind: AuditKind, command_id: Any = command.pk, **data: Any) -> None:
        audit_record(
            kind=kind,
            tenant=occurrence.tenant_id,
            occurrence=occurrence,
            command_id=command_id,
            data=data,
        )

    effect(AuditKind.EFFECT_SENDING, invocation=1)
    effect(AuditKind.EFFECT_OUTCOME_UNKNOWN, invocation=1)
    effect(AuditKind.RECOVERY_INTERRUPTED, invocation=2)
    effect(AuditKind.EFFECT_COMMITTED, command_id=other, invocation=9)  # another command's
    effect(AuditKind.EPOCH_ADMITTED, epoch=2)
    for n in range(25):  # more than the line reads
        effect(AuditKind.EFFECT_RETRY_SCHEDULED, invocation=3 + n)
    effect(AuditKind.EFFECT_COMMITTED, invocation=30, receipt="re_1")

    from_history = effect_evidence(occurrence, command, history=_events(occurrence))
    assert from_history == effect_evidence(occurrence, command)
    assert from_history.latest is not None and from_history.latest.kind == "effect.committed"


def test_a_consumed_page_whose_history_fits_asks_two_queries_less(
    runtime: Runtime, reviewer: Any, token: str, approved: str
) -> None:
    assert runtime.claim(token, "exec-a").status_code == 200
    client = signed_in(reviewer)
    with CaptureQueriesContext(connection) as page:
        response = client.get(f"/reviews/{approved}/")
    assert response.status_code == 200
    assert "Consumed" in response.content.decode()
    audit_reads = [q["sql"] for q in page.captured_queries if "approvals_auditevent" in q["sql"]]
    # The main query's subqueries and the history window; no grouped tally, no effect read.
    assert len(audit_reads) == 2, audit_reads
