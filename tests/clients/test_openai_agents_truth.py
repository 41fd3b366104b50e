"""The OpenAI Agents SDK bridge tells the model what happened (issue 27, section 1): the
real ``openai-agents`` package, its scripted model and a live console, each phase a new
process sharing only the saved ``RunState``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from agents import set_tracing_disabled
from agents.testing import assistant_message

from approvals.models import Command, Occurrence
from tests.clients.conftest import approve, edit
from tests.clients.test_openai_agents import Effects, first_phase, resume

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # the SDK would otherwise export traces over the network
    yield


def tool_outputs(process: Any) -> list[str]:
    """The tool outputs the model was shown in its last call."""
    last_call = process.model.last_call
    assert last_call is not None
    return [
        str(item["output"])
        for item in last_call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def test_the_reviewers_edit_is_told_to_the_model(
    live_server: Any, runtime: Any, reviewer: Any, second_reviewer: Any
):
    """D2: the tool ran with the reviewer's case_78; the model reads that the reviewer
    changed case_id, from what to what."""
    url, key, effects = live_server.url, runtime.raw_key, Effects()
    saved, occurrence_id = first_phase(url, key, effects)
    edit(occurrence_id, reviewer, {"case_id": "case_78"})
    approve(occurrence_id, second_reviewer)
    _, result, process = resume(url, key, saved, [[assistant_message("Done.")]], effects)
    assert result.final_output == "Done."
    (output,) = tool_outputs(process)
    assert 'case_id from "case_77" to "case_78"' in output and "rita" in output
    assert [arguments for arguments, _ in effects.calls] == [{"case_id": "case_78"}]
    assert Command.objects.get(occurrence_id=occurrence_id).state == Command.State.COMMITTED
    assert Occurrence.objects.count() == 1
