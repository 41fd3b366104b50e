"""Issue 10: the claim's words are typed once (approvals.vocabulary) and every surface
uses them: services, the API's schema, the pages' labels, the operators' investigations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from approvals import vocabulary
from approvals.claims import claim
from approvals.models import Command
from approvals.vocabulary import (
    EFFECT_NOT_SENT,
    ClaimDecision,
    ClaimReason,
    EffectState,
    ExecutedBy,
    ReportedOutcome,
    ReportedOutcomeLiteral,
    literal_values,
)
from approvals.web.presenters.history import OUTCOME_TEXT, SECURITY_DECISIONS
from approvals.web.selectors.history import DELIVERED
from reconciliation.investigations.facts import REFUSALS


def test_the_api_literals_are_the_vocabularys_groups() -> None:
    assert literal_values(vocabulary.AdmittingDecision) == tuple(vocabulary.ADMITTING)
    assert literal_values(vocabulary.RefusingDecision) == tuple(vocabulary.REFUSING)
    assert set(vocabulary.ADMITTING) | set(vocabulary.REFUSING) == set(ClaimDecision)
    assert not set(vocabulary.ADMITTING) & set(vocabulary.REFUSING)


# The document describes the tool contracts, read from the database.
@pytest.mark.django_db
def test_the_schema_lists_exactly_the_decisions(client: Any) -> None:
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]

    assert set(schemas["ClaimOut"]["properties"]["decision"]["enum"]) == set(vocabulary.ADMITTING)
    assert set(schemas["ClaimRefusedOut"]["properties"]["decision"]["enum"]) == set(
        vocabulary.REFUSING
    )


def test_every_surface_names_every_decision() -> None:
    assert DELIVERED == vocabulary.ADMITTING
    assert REFUSALS == vocabulary.REFUSING
    for decision in vocabulary.REFUSING:
        assert decision in SECURITY_DECISIONS
        assert decision in OUTCOME_TEXT
    assert ClaimDecision.DUPLICATE_DELIVERY in OUTCOME_TEXT


def test_every_reason_a_claim_can_give_is_in_the_vocabulary() -> None:
    """The reasons written in services are members, not strings typed again."""
    source = Path(claim.__file__).read_text(encoding="utf-8")
    start = source.index("def approval_claim(")
    claim_code = source[start:]
    for reason in ClaimReason:
        assert f'"{reason.value}"' not in claim_code, reason


def test_the_api_names_every_effect_state() -> None:
    """The API's effect states are the commands' (``pending`` shown as ``not_sent``)."""
    effect_states = {EFFECT_NOT_SENT} | set(Command.State.values) - {Command.State.PENDING}
    assert set(literal_values(EffectState)) == effect_states


def test_the_api_names_every_executor_and_reported_outcome() -> None:
    assert literal_values(ExecutedBy) == tuple(Command.ExecutedBy.values)
    assert literal_values(ReportedOutcomeLiteral) == tuple(ReportedOutcome.values)
