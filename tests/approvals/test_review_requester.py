"""The review page marks the agent-supplied requester by the rule the notifications use
(``approvals.access.requester``): a name that looks like a console user's but is written
differently is a visible warning on the page, worded as in the e-mail, escaped, with
invisible characters shown as ``\\uXXXX``; and the page reads no more queries for it."""

from __future__ import annotations

import html
from typing import Any

import pytest

from approvals.access.requester import requester_marks
from approvals.models import Membership, Tenant
from tests.approvals.test_views_html import parse, propose, signed_in
from tests.approvals.test_views_queries import queries_for
from tests.conftest import Runtime, make_user

pytestmark = pytest.mark.django_db

LOOK_RAVI = "rav\u0456"  # ravi with a Cyrillic i
HIDDEN_RAVI = "ravi\u200b"


def page_of(client: Any, runtime: Runtime, requested_by: str) -> Any:
    return parse(client.get(f"/reviews/{propose(runtime, requested_by=requested_by)}/"))


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_look_alike_of_a_member_is_a_warning_worded_as_in_the_e_mail(
    runtime: Runtime, reviewer: Any, second_reviewer: Any, tenant: Tenant
) -> None:
    page = page_of(signed_in(reviewer), runtime, LOOK_RAVI)

    marks = requester_marks(LOOK_RAVI, tenant.pk, tenant.name)
    assert marks["look_alike"] and marks["note"].startswith("looks like the console user ravi")
    warning = flat(page.text("requester-look-alike"))
    assert warning == flat(f"⚠ Look-alike requester: {LOOK_RAVI} {marks['note']}.")
    assert "U+0456 CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I looks like 'i'" in warning
    assert page.attr("requester-look-alike", "class") == "notice notice--warning requester-warning"
    assert "(member ravi)" not in page.text("requested-by")  # the old, milder wording


def test_an_invisible_character_is_shown_and_counted_in_the_warning(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    page = page_of(signed_in(reviewer), runtime, HIDDEN_RAVI)

    warning = flat(page.text("requester-look-alike"))
    assert warning.startswith("⚠ Look-alike requester: ravi\\u200b looks like the console user")
    assert "1 invisible character" in warning and "\u200b" not in page.text("requested-by")


def test_an_ascii_confusable_is_a_warning_too(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    make_user("mallory", tenant, Membership.Role.OPERATOR)
    page = page_of(signed_in(reviewer), runtime, "rnallory")

    assert (
        "looks like the console user mallory but is written differently: its letters only "
        "look like theirs." in flat(page.text("requester-look-alike"))
    )


def test_the_member_in_another_case_is_named_and_not_warned_about(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    client = signed_in(reviewer)
    for name in ("Ravi", "ravi@acme.test"):
        second_reviewer.email = "ravi@acme.test"
        second_reviewer.save(update_fields=["email"])
        page = page_of(client, runtime, name)
        assert "(member ravi)" in page.text("requested-by")
        assert not page.has("requester-look-alike")
    assert not page_of(client, runtime, "ravi").has("requester-look-alike")


def test_a_stranger_is_unverified_with_the_e_mails_words_and_escaped(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    client = signed_in(reviewer)
    name = "<b>g\u0456na</b>"
    response = client.get(f"/reviews/{propose(runtime, requested_by=name)}/")
    page = parse(response)

    text = flat(page.text("requested-by"))
    assert "unverified" in text and not page.has("requester-look-alike")
    assert (
        "No member of Acme has this name or e-mail address; the agent says so, nothing "
        "confirms it (mixes scripts in one word: Latin + Cyrillic;" in text
    )
    body = response.content.decode()
    assert name not in body and html.escape(name) in body


def test_the_warning_costs_the_page_no_query(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    client = signed_in(reviewer)
    plain = queries_for(client, f"/reviews/{propose(runtime, requested_by='ravi')}/")
    warned = queries_for(client, f"/reviews/{propose(runtime, requested_by=LOOK_RAVI)}/")
    stranger = queries_for(client, f"/reviews/{propose(runtime, requested_by='gina')}/")
    assert warned == plain == stranger
