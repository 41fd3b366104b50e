"""The Python client and a request that timed out: ``wait`` returns it, and the gate says
``timed_out`` (not run, not rejected) without asking for a token."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from approval_console import ApprovalConsole
from approval_console.gate import run_decided
from django.utils import timezone

from approvals.models import Occurrence, ToolContract
from approvals.reviews.deadlines import review_deadlines_apply
from tests.conftest import REFUND_ARGS

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_timed_out_request_is_told_as_timed_out_and_never_run(console: ApprovalConsole) -> None:
    ToolContract.objects.filter(name="issue_refund").update(final_deadline=timedelta(hours=1))
    proposed = console.propose(
        "issue_refund", REFUND_ARGS, run_id="run-deadline", reason="r", client_ref="c1"
    )
    occurrence_id = proposed.occurrence_id
    Occurrence.objects.filter(pk=occurrence_id).update(
        final_deadline_at=timezone.now() - timedelta(seconds=1)
    )
    assert review_deadlines_apply() == (0, 1)

    occurrence = console.wait(occurrence_id, timeout=5)
    assert occurrence.status == "timed_out"
    calls: list[Any] = []
    outcome = run_decided(
        console,
        occurrence,
        execution_id="exec-1",
        execute=lambda arguments, key: calls.append(arguments),
    )
    assert outcome.status == "timed_out"
    assert "not rejected" in outcome.message
    assert calls == []
