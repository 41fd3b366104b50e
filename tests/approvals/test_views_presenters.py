"""What the console's pages say, tested without a page: money read for people, the history
table's flags, and the evidence line that tells a redelivery from a replay. Then the same
things as the review page and the inbox show them."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import AuditEvent, Command
from approvals.web.money import format_money, minor_units, money_lines
from approvals.web.presenters.history import (
    EvidencePart,
    evidence_parts,
    evidence_text,
    history_row,
)
from approvals.web.selectors.history import (
    DELIVERED,
    EVIDENCE_NAMES,
    TALLY_CACHE_MIN_EVENTS,
    ClaimTally,
)
from approvals.web.text import reveal
from tests.approvals.test_views_html import parse, propose, signed_in
from tests.conftest import REFUND_ARGS, Runtime


def evidence_summary(events: list[AuditEvent]) -> list[EvidencePart]:
    """The evidence line of a list of events, counted here the way
    ``approvals.web.selectors.history.claim_tally`` counts in the database (the page uses
    that one)."""
    claims = [e for e in events if e.kind.startswith("claim.")]
    by_decision = Counter(e.decision for e in claims)
    deliveries: Counter[str] = Counter(e.execution_id for e in claims if e.decision in DELIVERED)
    replayers = list(dict.fromkeys(e.execution_id for e in claims if e.decision == "replayed"))
    return evidence_parts(
        ClaimTally(
            by_decision=dict(by_decision),
            commands=len(
                {e.command_id for e in claims if e.decision == "approved" and e.command_id}
            ),
            deliveries=list(deliveries.items())[:EVIDENCE_NAMES],
            replayers=replayers[:EVIDENCE_NAMES],
            replayer_total=len(replayers),
        )
    )


# --- money ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "currency", "expected"),
    [
        (8000, "EUR", "EUR 80.00"),
        (129900, "USD", "USD 1,299.00"),
        (5, "EUR", "EUR 0.05"),
        (0, "GBP", "GBP 0.00"),
        (-250, "EUR", "EUR -2.50"),
        (12000, "JPY", "JPY 12,000"),
        (1500000, "KRW", "KRW 1,500,000"),
        (990, "CLP", "CLP 990"),
        (25000, "VND", "VND 25,000"),
        (700, "ISK", "ISK 700"),
        (5000, "XOF", "XOF 5,000"),
        (12345, "KWD", "KWD 12.345"),
        (1, "BHD", "BHD 0.001"),
        (1000, "TND", "TND 1.000"),
        (2**53 - 1, "EUR", "EUR 90,071,992,547,409.91"),
    ],
)
def test_format_money_uses_iso_4217_minor_units(amount: int, currency: str, expected: str) -> None:
    assert format_money(amount, currency) == expected


def test_unlisted_currencies_have_two_minor_units() -> None:
    assert minor_units("CHF") == 2
    assert {minor_units(c) for c in ("JPY", "KRW", "VND", "CLP", "ISK", "UGX", "XAF")} == {0}
    assert {minor_units(c) for c in ("BHD", "KWD", "OMR", "JOD", "TND", "IQD", "LYD")} == {3}


def test_money_lines_pair_minor_amounts_with_their_sibling_currency() -> None:
    lines = money_lines(
        {
            "amount_minor": 8000,
            "fee_minor": 150,
            "currency": "EUR",
            "lines": [{"unit_price_minor": 1234, "currency": "JPY"}],
            "shipping": {"cost_minor": 12345, "currency": "KWD"},
        }
    )
    assert [(str(x.label), str(x.path), x.text) for x in lines] == [
        ("Amount", "amount_minor", "EUR 80.00"),
        ("Fee", "fee_minor", "EUR 1.50"),
        ("Unit price", "lines[0].unit_price_minor", "JPY 1,234"),
        ("Cost", "shipping.cost_minor", "KWD 12.345"),
    ]


@pytest.mark.parametrize(
    "arguments",
    [
        {"amount_minor": 8000},  # no currency beside it
        {"amount_minor": 8000, "currency": "eur"},  # not an ISO code
        {"amount_minor": 8000, "currency": "EURO"},
        {"amount_minor": 8000, "currency": 978},
        {"amount_minor": "8000", "currency": "EUR"},  # not an integer
        {"amount_minor": 80.0, "currency": "EUR"},
        {"amount_minor": True, "currency": "EUR"},
        {"_minor": 1, "currency": "EUR"},
        {"amount": 8000, "currency": "EUR"},  # not in minor units
        {"nested": {"amount_minor": 1}, "currency": "EUR"},  # the currency is not a sibling
    ],
)
def test_money_lines_guess_nothing(arguments: dict[str, Any]) -> None:
    assert money_lines(arguments) == []


def test_money_line_labels_reveal_hidden_characters_in_keys() -> None:
    (line,) = money_lines({"amo\u202eunt_minor": 1, "currency": "EUR"})
    assert "\u202e" not in line.path and "\\u202e" in line.path
    assert line.path == reveal("amo\u202eunt_minor").html


# --- the history table ------------------------------------------------------------------------


def _event(kind: str, decision: str = "", execution_id: str = "", **fields: Any) -> AuditEvent:
    return AuditEvent(
        kind=kind,
        decision=decision,
        execution_id=execution_id,
        source_time=datetime(2026, 1, 1, tzinfo=UTC),
        **fields,
    )


@pytest.mark.parametrize(
    ("kind", "decision", "label"),
    [
        ("claim.replayed", "replayed", "Replay refused"),
        ("claim.scope_mismatch", "scope_mismatch", "Scope mismatch"),
        ("claim.unknown_token", "unknown_token", "Unknown token"),
        ("claim.expired", "expired", "Expired token"),
        ("claim.revoked", "revoked", "Revoked token"),
        ("approval.revoked", "revoked", "Approval revoked"),
    ],
)
def test_security_relevant_decisions_are_flagged_in_words(
    kind: str, decision: str, label: str
) -> None:
    row = history_row(_event(kind, decision))
    assert (row.flag, row.flag_label) == ("security", label)
    assert row.outcome


def test_duplicate_delivery_reads_as_a_healthy_redelivery() -> None:
    row = history_row(_event("claim.duplicate_delivery", "duplicate_delivery", "worker-a"))
    assert row.flag == "redelivery"
    assert "healthy" in row.flag_label.lower()
    assert "same execution" in row.outcome and "nothing ran twice" in row.outcome


@pytest.mark.parametrize("decision", ["", "approved", "issued", "rejected", "auto_admitted"])
def test_ordinary_decisions_carry_no_flag(decision: str) -> None:
    assert history_row(_event("x.y", decision)).flag == ""


def test_history_details_name_identifiers_and_keep_them_whole() -> None:
    row = history_row(
        _event(
            "claim.approved",
            "approved",
            "worker-a",
            message_id="msg-1",
            command_id="7c9e6679-7425-40de-944b-e07fc1f90ae7",
            data={"epoch": 1, "idempotency_key": "cmd_" + "a" * 32},
        )
    )
    assert [(d.key, d.value, d.code) for d in row.details] == [
        ("epoch", "1", False),
        ("idempotency key", "cmd_" + "a" * 32, True),
        ("execution", "worker-a", True),
        ("message", "msg-1", True),
        ("command", "7c9e6679-7425-40de-944b-e07fc1f90ae7", True),
    ]
    assert row.kind == (
        '<span class="kind-part">claim.</span><span class="kind-part">approved</span>'
    )


# --- the evidence line ---------------------------------------------------------------------


def test_evidence_tells_a_redelivery_from_a_replay() -> None:
    command = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    events = [
        _event("occurrence.proposed"),
        _event("approval.issued", "issued"),
        _event("claim.approved", "approved", "worker-a", command_id=command),
        _event("claim.duplicate_delivery", "duplicate_delivery", "worker-a", command_id=command),
        _event("claim.replayed", "replayed", "worker-b"),
    ]
    assert evidence_text(evidence_summary(events)) == (
        "1 command · 2 deliveries of execution worker-a · 1 replay refused (worker-b)"
    )


def test_evidence_of_a_single_clean_claim() -> None:
    events = [_event("claim.approved", "approved", "exec-1", command_id="c1")]
    assert evidence_text(evidence_summary(events)) == (
        "1 command · 1 delivery of execution exec-1 · no replay attempts"
    )


def test_evidence_names_each_replaying_execution_once_and_other_refusals() -> None:
    events = [
        _event("claim.approved", "approved", "a", command_id="c1"),
        _event("claim.replayed", "replayed", "b"),
        _event("claim.replayed", "replayed", "b"),
        _event("claim.replayed", "replayed", "c"),
        _event("claim.scope_mismatch", "scope_mismatch", "d"),
    ]
    parts = evidence_summary(events)
    assert evidence_text(parts) == (
        "1 command · 1 delivery of execution a · 3 replays refused (b, c)"
        " · 1 claim refused: scope mismatch"
    )
    assert [p.alarm for p in parts] == [False, False, True, False]


def test_two_approved_claims_are_called_a_control_failure() -> None:
    events = [
        _event("claim.approved", "approved", "a", command_id="c1"),
        _event("claim.approved", "approved", "b", command_id="c2"),
    ]
    parts = evidence_summary(events)
    assert evidence_text(parts).startswith("2 commands · 2 approved claims: control failure")
    assert parts[0].alarm and parts[1].alarm


# --- on the pages ------------------------------------------------------------------------------


def _normal(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def consumed(runtime: Runtime, token: str, approved: str) -> str:
    assert runtime.claim(token, "worker-a", message_id="m1").json()["decision"] == "approved"
    redelivery = runtime.claim(token, "worker-a", message_id="m2")
    assert redelivery.json()["decision"] == "duplicate_delivery"
    assert runtime.claim(token, "worker-b").json()["decision"] == "replayed"
    return approved


def test_consumed_panel_summarises_the_claim_evidence(reviewer: Any, consumed: str) -> None:
    page = parse(signed_in(reviewer).get(f"/reviews/{consumed}/"))
    assert _normal(page.text("evidence-summary")) == (
        "Evidence: 1 command · 2 deliveries of execution worker-a · 1 replay refused (worker-b)"
    )
    assert "hx-disable" in page.by_id["evidence-summary"].attrs
    history = _normal(page.text("history"))
    assert "Security: Replay refused" in history
    assert "Redelivery · healthy" in history
    command = Command.objects.get(occurrence_id=consumed)
    # Long identifiers are shown whole, each in an element of its own that may wrap.
    assert f"<code>{command.idempotency_key}</code>" in page.source
    assert f"<code>{command.pk}</code>" in page.source


def test_evidence_costs_no_queries_however_many_claims(
    reviewer: Any, consumed: str, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(reviewer)
    with CaptureQueriesContext(connection) as captured:
        client.get(f"/reviews/{consumed}/")
    occurrence = Command.objects.get(occurrence_id=consumed).occurrence
    for n in range(10):
        AuditEvent.objects.create(
            kind="claim.replayed",
            tenant=occurrence.tenant,
            occurrence=occurrence,
            decision="replayed",
            execution_id=f"worker-{n}",
            source_time=datetime(2026, 1, 1, tzinfo=UTC),
        )
    with django_assert_max_num_queries(len(captured.captured_queries)):
        response = client.get(f"/reviews/{consumed}/")
    assert "11 replays refused" in _normal(parse(response).text("evidence-summary"))


def test_review_page_reads_the_amount_beside_the_untouched_json(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(
        runtime, arguments=dict(REFUND_ARGS, amount_minor=129900, currency="USD")
    )
    page = parse(signed_in(reviewer).get(f"/reviews/{occurrence_id}/"))
    assert re.search(r"Amount\s+USD 1,299\.00", page.text("money"))
    assert "USD 1,299.00" not in page.text("canonical-action")
    assert '"amount_minor": 129900' in page.text("canonical-action")
    assert "hx-disable" in page.by_id["money"].attrs


def test_inbox_summary_shows_the_amount_for_people(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = propose(
        runtime, arguments=dict(REFUND_ARGS, amount_minor=12000, currency="JPY")
    )
    html = signed_in(reviewer).get("/reviews/").content.decode()
    row = html[html.index(f'data-occurrence-id="{occurrence_id}"') :]
    row = row[: row.index("</tr>")]
    assert "JPY 12,000" in row and "amount_minor=12000" in row


# What a history longer than the review page's window costs beyond one that fits in it
# (whose claims and effect line are counted from the events read): the grouped tally, the
# replaying executions it names, and the command's effect line.
LONG_HISTORY_READS = 3


def test_evidence_counts_every_claim_not_just_the_shown_history(
    reviewer: Any, consumed: str, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(reviewer)
    with CaptureQueriesContext(connection) as captured:
        client.get(f"/reviews/{consumed}/")
    occurrence = Command.objects.get(occurrence_id=consumed).occurrence
    # 300 more refused replays from 30 executions: far more than the page's history shows.
    AuditEvent.objects.bulk_create(
        AuditEvent(
            kind="claim.replayed",
            tenant=occurrence.tenant,
            occurrence=occurrence,
            decision="replayed",
            execution_id=f"worker-{n % 30:02d}",
            source_time=datetime(2026, 1, 1, tzinfo=UTC),
        )
        for n in range(300)
    )
    # A history longer than its window is counted by the database: the grouped tally, the
    # replaying executions it names and the effect line, however many events there are.
    with django_assert_max_num_queries(len(captured.captured_queries) + LONG_HISTORY_READS):
        response = client.get(f"/reviews/{consumed}/")
    page = parse(response)
    assert _normal(page.text("history")).startswith("History latest 50 of ")
    named = ", ".join(["worker-b"] + [f"worker-{n:02d}" for n in range(9)])
    assert _normal(page.text("evidence-summary")) == (
        "Evidence: 1 command · 2 deliveries of execution worker-a · "
        f"301 replays refused ({named} and 21 more)"
    )


def _replays(occurrence: Any, executions: range, times: int = 1) -> None:
    AuditEvent.objects.bulk_create(
        AuditEvent(
            kind="claim.replayed",
            tenant=occurrence.tenant,
            occurrence=occurrence,
            decision="replayed",
            execution_id=f"worker-{n:04d}",
            source_time=datetime(2026, 1, 1, tzinfo=UTC),
        )
        for n in executions
        for _ in range(times)
    )


def test_a_long_historys_evidence_is_recounted_when_an_event_arrives(
    reviewer: Any, consumed: str, django_assert_max_num_queries: Any
) -> None:
    """Past TALLY_CACHE_MIN_EVENTS the tally is kept between pages, keyed by how many
    events the occurrence has: a page never shows a tally older than its history."""
    client = signed_in(reviewer)
    with CaptureQueriesContext(connection) as captured:
        client.get(f"/reviews/{consumed}/")
    occurrence = Command.objects.get(occurrence_id=consumed).occurrence
    _replays(occurrence, range(TALLY_CACHE_MIN_EVENTS))
    short = len(captured.captured_queries)
    # Counted, then remembered (the effect line is read again): never more queries however
    # long the history grows.
    for budget in (short + LONG_HISTORY_READS, short + 1):
        with django_assert_max_num_queries(budget):
            response = client.get(f"/reviews/{consumed}/")
        evidence = _normal(parse(response).text("evidence-summary"))
        assert f"{TALLY_CACHE_MIN_EVENTS + 1:,} replays refused (worker-b, worker-0000," in evidence
        assert f"and {TALLY_CACHE_MIN_EVENTS + 1 - EVIDENCE_NAMES:,} more)" in evidence
    # One more replay, by an execution seen before: the same names, one more refusal.
    _replays(occurrence, range(1))
    evidence = _normal(parse(client.get(f"/reviews/{consumed}/")).text("evidence-summary"))
    assert f"{TALLY_CACHE_MIN_EVENTS + 2:,} replays refused" in evidence
    assert f"and {TALLY_CACHE_MIN_EVENTS + 1 - EVIDENCE_NAMES:,} more)" in evidence
    # A second command would be a control failure: the page says so at once.
    AuditEvent.objects.create(
        kind="claim.approved",
        tenant=occurrence.tenant,
        occurrence=occurrence,
        decision="approved",
        execution_id="worker-z",
        command_id=uuid.uuid4(),
        source_time=datetime(2026, 1, 1, tzinfo=UTC),
    )
    evidence = _normal(parse(client.get(f"/reviews/{consumed}/")).text("evidence-summary"))
    assert evidence.startswith("Evidence: 2 commands · 2 approved claims: control failure")


def test_evidence_names_the_first_replaying_executions_and_counts_the_rest() -> None:
    events = [_event("claim.approved", "approved", "a", command_id="c1")] + [
        _event("claim.replayed", "replayed", f"r{n}") for n in range(12)
    ]
    assert evidence_text(evidence_summary(events)) == (
        "1 command · 1 delivery of execution a · "
        "12 replays refused (r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 and 2 more)"
    )
