"""Issue 23: characters a reader cannot see, beyond controls and format characters.

Every Unicode Default_Ignorable_Code_Point (the combining grapheme joiner U+034F,
variation selectors, tag characters, and the Hangul fillers U+115F, U+1160, U+3164,
U+FFA0, which are letters drawn as blank space) is hidden:

- stripped before the self-approval comparison, so ``rita\\u034f`` is rita, on the page,
  in the service and through her access token;
- shown as ``\\uXXXX`` wherever an identifier is shown (inbox, review page, timeline,
  investigation), and highlighted in free text (the agent's reason).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from approvals.canonical.confusables import identity_key, is_hidden, same_person
from approvals.errors import ServiceError
from approvals.models import ApprovalVote, Occurrence, Tenant
from approvals.reviews.decisions import occurrence_approve
from approvals.web.text import plain_reveal, reveal
from tests.approvals.test_reviewer_tokens import decide, digest_of, pat_for
from tests.approvals.test_views_html import parse, propose, signed_in
from tests.conftest import Runtime

HANGUL_FILLERS = ["\u115f", "\u1160", "\u3164", "\uffa0"]
# Default ignorable, yet neither a control nor a format character: a mark (U+034F, the
# variation selectors, U+17B4) or a letter (the fillers). Each passed before.
IGNORABLE_NOT_FORMAT = ["\u034f", "\ufe0f", "\U000e0100", "\u17b4", *HANGUL_FILLERS]


def escaped(char: str) -> str:
    return plain_reveal(char)


@pytest.mark.parametrize("char", IGNORABLE_NOT_FORMAT)
def test_default_ignorable_characters_are_hidden(char: str) -> None:
    assert is_hidden(char)
    assert reveal(f"worker-a{char}").hidden == 1


def test_the_hangul_fillers_are_default_ignorable_in_icus_data() -> None:
    # is_hidden reads the property from ICU instead of a table: if a Unicode version ever
    # dropped the fillers from it, this says so.
    import icu

    for char in HANGUL_FILLERS:
        assert icu.Char.hasBinaryProperty(char, icu.UProperty.DEFAULT_IGNORABLE_CODE_POINT)


@pytest.mark.parametrize("text", ["café", "Привет", "한국어", "日本語", "worker-a", "a b", "x\ty"])
def test_visible_text_stays_visible(text: str) -> None:
    assert not any(is_hidden(c) for c in text)
    assert reveal(text).hidden == 0


@pytest.mark.parametrize("char", IGNORABLE_NOT_FORMAT)
def test_identity_key_strips_default_ignorable_characters(char: str) -> None:
    assert identity_key(f"rita{char}") == "rita"
    assert identity_key(f"ri{char}ta") == "rita"
    assert same_person(f"{char}rita", "rita")
    assert not same_person(char, "")  # an invisible name names no one


@pytest.mark.parametrize("char", ["\u034f", "\u3164", "\u115f", "\uffa0"])
def test_the_requester_with_an_invisible_suffix_cannot_approve(
    runtime: Runtime, reviewer: Any, char: str
) -> None:
    occurrence = Occurrence.objects.get(pk=propose(runtime, requested_by=f"rita{char}"))
    digest = occurrence.proposals.get(is_current=True).action_digest

    with pytest.raises(ServiceError) as raised:
        occurrence_approve(occurrence=occurrence, reviewer=reviewer, seen_digest=digest)

    assert raised.value.code == "self_approval"
    assert not ApprovalVote.objects.filter(proposal__occurrence=occurrence).exists()


@pytest.mark.parametrize("char", ["\u034f", "\u3164"])
def test_the_requester_with_an_invisible_suffix_cannot_approve_in_the_browser(
    runtime: Runtime, reviewer: Any, char: str
) -> None:
    occurrence_id = propose(runtime, requested_by=f"rita{char}")
    client = signed_in(reviewer)
    page = parse(client.get(f"/reviews/{occurrence_id}/"))
    assert "You are the requester" in page.text("approve-form")
    assert escaped(char) in page.text("requested-by")

    client.post(f"/reviews/{occurrence_id}/approve", {"action_digest": digest_of(occurrence_id)})

    assert Occurrence.objects.get(pk=occurrence_id).status == Occurrence.Status.PENDING_REVIEW
    assert not ApprovalVote.objects.filter(proposal__occurrence_id=occurrence_id).exists()


@pytest.mark.parametrize("char", ["\u034f", "\u3164", "\u115f"])
def test_the_requester_with_an_invisible_suffix_cannot_approve_with_her_access_token(
    runtime: Runtime, reviewer: Any, tenant: Tenant, char: str
) -> None:
    occurrence_id = propose(runtime, requested_by=f"rita{char}")
    raw = pat_for(reviewer, tenant)

    response = decide(
        raw, occurrence_id, {"decision": "approve", "seen_digest": digest_of(occurrence_id)}
    )

    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "self_approval"
    assert Occurrence.objects.get(pk=occurrence_id).status == Occurrence.Status.PENDING_REVIEW


FILLER_EXECUTION = "worker-a\u3164"
JOINER_MESSAGE = "msg-1\u034f"


@pytest.fixture
def filler_claim(runtime: Runtime, token: str, approved: str) -> str:
    response = runtime.claim(token, FILLER_EXECUTION, message_id=JOINER_MESSAGE)
    assert response.json()["decision"] == "approved", response.content
    return approved


def test_invisible_characters_in_execution_ids_are_revealed_on_the_review_page(
    reviewer: Any, filler_claim: str
) -> None:
    page = parse(signed_in(reviewer).get(f"/reviews/{filler_claim}/"))

    assert "\u3164" not in page.source and "\u034f" not in page.source
    assert "worker-a\\u3164" in page.text("decision-panel")
    assert "worker-a\\u3164" in page.text("evidence-summary")
    assert "msg-1\\u034f" in page.text("history")


def test_invisible_characters_in_execution_ids_are_revealed_on_the_timeline(
    operator: Any, filler_claim: str
) -> None:
    response = signed_in(operator).get(f"/operations/occurrences/{filler_claim}/")
    assert response.status_code == 200
    source = response.content.decode()

    assert "\u3164" not in source and "\u034f" not in source
    assert "worker-a<mark" in source and "\\u3164" in source


def shown_outside_the_query(source: str) -> str:
    """The page but its search field, which holds the query as typed so it can be edited,
    and its <title>."""
    source = re.sub(r"<title>.*?</title>", "", source, flags=re.S)
    return re.sub(r'<input id="q"[^>]*>', "", source)


def test_invisible_characters_in_execution_ids_are_revealed_in_the_investigation(
    operator: Any, runtime: Runtime, token: str, filler_claim: str
) -> None:
    # A second execution presents the token: the verdict names both executions.
    assert runtime.claim(token, "worker-a").json()["decision"] == "replayed"

    response = signed_in(operator).get("/investigations/", {"q": FILLER_EXECUTION})
    assert response.status_code == 200
    page = parse(response)

    shown = shown_outside_the_query(page.source)
    assert "\u3164" not in shown and "\u034f" not in shown
    assert "worker-a\\u3164" in page.text("verdict")
    # The executions counted, in a tooltip.
    assert re.search(r'title="[^"]*worker-a\\u3164[^"]*"><strong>2</strong> executions', shown)
    assert "worker-a<mark" in shown  # the commands and the chain


def test_an_unknown_id_with_an_invisible_character_is_revealed_in_the_investigation(
    operator: Any, tenant: Tenant
) -> None:
    page = parse(signed_in(operator).get("/investigations/", {"q": "worker-b\u3164"}))

    assert "worker-b\\u3164" in page.text("verdict")
    assert "\u3164" not in shown_outside_the_query(page.source)


def test_invisible_characters_in_requester_and_run_are_revealed_in_the_inbox(
    runtime: Runtime, reviewer: Any
) -> None:
    propose(runtime, requested_by="ravi\u3164", run_id="run\u034f-7")
    source = signed_in(reviewer).get("/reviews/").content.decode()

    assert "\u3164" not in source and "\u034f" not in source
    assert "ravi<mark" in source and "\\u3164" in source
    assert "run<mark" in source and "\\u034f" in source


def test_invisible_characters_in_the_reason_are_highlighted(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(runtime, reason="Refund\u3164 approved by finance\u034f")
    page = parse(signed_in(reviewer).get(f"/reviews/{occurrence_id}/"))

    assert "\u3164" not in page.source and "\u034f" not in page.source
    words = page.text("agent-reason").split()
    assert words == ["Refund\\u3164", "approved", "by", "finance\\u034f"]
    assert 'title="Invisible character U+3164"' in page.source
