"""Issue 9, section 2: reviewers cannot be fooled by how agent-supplied text looks.

- the requester, written another way (case, spaces, hidden characters, their email address,
  a look-alike letter), still cannot approve their own request; a requester who is no member
  of the tenant is shown as unverified;
- look-alike text (mixed scripts, fullwidth digits, stacked combining marks) is flagged on
  the review page and in the inbox (Unicode TR39 through ICU), and identifier arguments of
  the shipped contracts accept ASCII only;
- bidi controls in execution and message ids are shown as escapes wherever they appear;
- currencies are ISO 4217 currencies (not XXX, ZZZ, XTS, gold or funds), amounts are shown
  with ISO 4217 minor units, and the quorum threshold is per currency.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from approvals.canonical.confusables import identity_key, look_alikes
from approvals.canonical.money import currency_exponent
from approvals.canonical.schema import validate_arguments
from approvals.errors import InputError, ServiceError
from approvals.models import ApprovalVote, AuditEvent, Membership, Occurrence, Tenant, ToolContract
from approvals.reviews.decisions import occurrence_approve
from approvals.web.money import format_money, minor_units, money_lines
from approvals.web.presenters.review import quorum_rule
from approvals.web.text import argument_flags
from tests.approvals.test_views_html import parse, propose, signed_in
from tests.conftest import REFUND_ARGS, Runtime, make_user

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: "worker\u202egnp.exe" shows as "workerexe.png"
SPOOFED_EXECUTION = f"worker{RLO}gnp.exe"
SPOOFED_MESSAGE = f"msg{RLO}fdp.exe"

LOOK_ALIKE_PAYMENT_IDS = [
    "p\u0430y_42",  # a Cyrillic a
    "pay_\uff14\uff12",  # fullwidth digits
    "pay_4\u03022",  # a combining circumflex on the 4
]


def refund(**arguments: Any) -> dict[str, Any]:
    return {**REFUND_ARGS, **arguments}


def contract(name: str = "issue_refund") -> ToolContract:
    return ToolContract.objects.get(name=name)


# --- self-approval ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "requested_by",
    ["rita", "Rita", "rita ", "rita\u200b", "RITA", "rita@acme.example", "r\u0456ta", "\u2067rita"],
)
def test_the_requester_written_another_way_cannot_approve(
    runtime: Runtime, reviewer: Any, requested_by: str
) -> None:
    reviewer.email = "rita@acme.example"
    reviewer.save()
    occurrence = Occurrence.objects.get(pk=propose(runtime, requested_by=requested_by))
    digest = occurrence.proposals.get(is_current=True).action_digest

    with pytest.raises(ServiceError) as raised:
        occurrence_approve(occurrence=occurrence, reviewer=reviewer, seen_digest=digest)

    assert (raised.value.code, raised.value.status) == ("self_approval", 403)
    assert not ApprovalVote.objects.filter(proposal__occurrence=occurrence).exists()
    assert Occurrence.objects.get(pk=occurrence.pk).status == Occurrence.Status.PENDING_REVIEW


def test_the_requester_cannot_approve_through_the_page_either(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence_id = propose(runtime, requested_by="RITA ")
    client = signed_in(reviewer)
    page = parse(client.get(f"/reviews/{occurrence_id}/"))
    assert "You are the requester" in page.text("approve-form")

    digest = Occurrence.objects.get(pk=occurrence_id).proposals.get(is_current=True).action_digest
    client.post(f"/reviews/{occurrence_id}/approve", {"action_digest": digest})

    assert Occurrence.objects.get(pk=occurrence_id).status == Occurrence.Status.PENDING_REVIEW
    assert not ApprovalVote.objects.filter(proposal__occurrence_id=occurrence_id).exists()


def test_another_reviewer_still_approves_a_request_made_for_someone_else(
    runtime: Runtime, reviewer: Any
) -> None:
    occurrence = Occurrence.objects.get(pk=propose(runtime, requested_by="Ritaa"))
    digest = occurrence.proposals.get(is_current=True).action_digest

    outcome = occurrence_approve(occurrence=occurrence, reviewer=reviewer, seen_digest=digest)

    assert outcome.issued


def test_identity_key_removes_what_a_reader_cannot_see() -> None:
    assert {identity_key(n) for n in ["Rita", " rita", "rita\u200b", "RITA", "r\u0456ta"]} == {
        "rita"
    }
    assert identity_key("\u200b\u202e") == ""
    assert identity_key("Rita Levi") == identity_key("rita\u00a0 levi")


def test_a_requester_who_is_no_member_is_shown_as_unverified(
    runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    make_user("alice", tenant, Membership.Role.OPERATOR)
    client = signed_in(reviewer)

    stranger = parse(client.get(f"/reviews/{propose(runtime, requested_by='mallory')}/"))
    member = parse(client.get(f"/reviews/{propose(runtime, requested_by='alice')}/"))
    spelled = parse(client.get(f"/reviews/{propose(runtime, requested_by='ALICE')}/"))
    nobody = parse(client.get(f"/reviews/{propose(runtime)}/"))

    assert "unverified" in stranger.text("requested-by")
    assert "No member of Acme" in stranger.text("requested-by")
    assert "unverified" not in member.text("requested-by")
    assert "unverified" not in spelled.text("requested-by")
    assert "member alice" in spelled.text("requested-by")
    assert " ".join(nobody.text("requested-by").split()) == "not given"


# --- look-alike text -------------------------------------------------------------------------


@pytest.mark.parametrize("payment_id", LOOK_ALIKE_PAYMENT_IDS)
def test_look_alike_values_read_as_what_they_imitate(payment_id: str) -> None:
    (found,) = look_alikes(payment_id)
    assert found.word == payment_id
    assert found.reads_as == "pay_42"
    assert found.reasons


def test_mixed_scripts_are_named() -> None:
    (found,) = look_alikes("p\u0430y_42")
    assert "mixes scripts in one word: Latin + Cyrillic" in found.reasons
    assert "U+0430 CYRILLIC SMALL LETTER A looks like 'a'" in found.reasons


@pytest.mark.parametrize(
    "text",
    [
        "pay_42",
        "Lost parcel, refund of 42.00",
        "Caf\u00e9 cr\u00e8me for Chlo\u00e9",
        "cafe\u0301",  # decomposed, but a letter Unicode has
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440",  # Russian, one script
        "\u6771\u4eac tokyo \u6771\u4eacstation",  # Han with Latin: one writing system
        "Don\u2019t \u2013 ok\u2026",  # typographic punctuation
    ],
)
def test_ordinary_text_is_not_flagged(text: str) -> None:
    assert look_alikes(text) == []


def test_a_word_in_one_script_that_passes_for_ascii_is_flagged() -> None:
    (found,) = look_alikes("refund \u0440\u0430\u0443 now")  # Cyrillic "pay"
    assert found.reads_as == "pay"


@pytest.mark.parametrize("payment_id", [*LOOK_ALIKE_PAYMENT_IDS, "pay_42\n", "pay 42"])
def test_payment_ids_are_ascii_identifiers(runtime: Runtime, payment_id: str) -> None:
    response = runtime.propose(arguments=refund(payment_id=payment_id))

    assert response.status_code == 422, response.content
    assert response.json()["error"]["details"][0]["field"] == "arguments.payment_id"
    assert not Occurrence.objects.exists()


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        (
            "send_message",
            {"to": "d\u0430na@example.com", "subject": "s", "body": "b"},
            "arguments.to",
        ),
        (
            "send_message",
            {"to": "dana@ex\u0430mple.com", "subject": "s", "body": "b"},
            "arguments.to",
        ),
        ("send_message", {"to": "dana@example.com\n", "subject": "s", "body": "b"}, "arguments.to"),
        ("lookup_order", {"order_id": "\uff11\uff10\uff14\uff12"}, "arguments.order_id"),
        ("lookup_order", {"order_id": "1042\u200b"}, "arguments.order_id"),
    ],
)
def test_identifier_arguments_of_the_shipped_contracts_are_ascii(
    runtime: Runtime, tool: str, arguments: dict[str, Any], field: str
) -> None:
    response = runtime.propose(tool, arguments=arguments)

    assert response.status_code == 422, response.content
    assert response.json()["error"]["details"][0]["field"] == field


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        (
            "send_message",
            {"to": "dana.whitfield+refunds@example.co.uk", "subject": "s", "body": "b"},
        ),
        ("send_message", {"to": "a@b.c", "subject": "s", "body": "b"}),
        ("send_message", {"to": "dana@xn--bcher-kva.example", "subject": "s", "body": "b"}),
        ("lookup_order", {"order_id": "ord_1042-B"}),
    ],
)
def test_ordinary_identifiers_are_still_accepted(
    runtime: Runtime, tool: str, arguments: dict[str, Any]
) -> None:
    assert runtime.propose(tool, arguments=arguments).status_code == 201


@pytest.mark.parametrize("payment_id", LOOK_ALIKE_PAYMENT_IDS)
def test_look_alike_text_is_flagged_on_the_review_page_and_in_the_inbox(
    runtime: Runtime, reviewer: Any, payment_id: str
) -> None:
    # payment_id refuses them now; the free-text reason still carries them.
    occurrence_id = propose(runtime, arguments=refund(reason=f"Refund {payment_id} in full"))
    client = signed_in(reviewer)

    review = parse(client.get(f"/reviews/{occurrence_id}/"))
    flagged = " ".join(review.text("look-alikes").split())
    assert "Look-alike text" in flagged
    assert "reason" in flagged
    assert "reads as pay_42 but is not" in flagged
    assert 'class="hidden-char lookalike-char"' in review.source

    html = client.get("/reviews/").content.decode()
    assert "look-alike text in <code>reason</code>" in html
    assert "badge--look-alike" in html


def test_plain_requests_carry_no_look_alike_warning(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = propose(runtime)
    client = signed_in(reviewer)

    assert not parse(client.get(f"/reviews/{occurrence_id}/")).has("look-alikes")
    assert "badge--look-alike" not in client.get("/reviews/").content.decode()


def test_argument_flags_name_the_path_at_any_depth() -> None:
    flags = argument_flags({"lines": [{"sku": "ok"}, {"sku": "SKU-\uff11"}], "note": "fine"})
    assert [(str(f.path), str(f.reads_as)) for f in flags] == [("lines[1].sku", "SKU-1")]
    assert flags[0].text.startswith("lines[1].sku: U+FF11 FULLWIDTH DIGIT ONE")


# --- bidi controls in execution and message ids -----------------------------------------------


@pytest.fixture
def spoofed_claim(runtime: Runtime, token: str, approved: str) -> str:
    response = runtime.claim(token, SPOOFED_EXECUTION, message_id=SPOOFED_MESSAGE)
    assert response.json()["decision"] == "approved", response.content
    return approved


def test_bidi_controls_in_execution_and_message_ids_are_revealed_on_the_review_page(
    reviewer: Any, spoofed_claim: str
) -> None:
    response = signed_in(reviewer).get(f"/reviews/{spoofed_claim}/")
    page = parse(response)

    assert RLO not in page.source
    escaped = "\\u202e"
    assert escaped in page.text("decision-panel")  # "Consumed by execution ..."
    assert escaped in page.text("evidence-summary")
    history = page.text("history")
    assert f"worker{escaped}gnp.exe" in history
    assert f"msg{escaped}fdp.exe" in history


def test_bidi_controls_are_revealed_on_the_operators_timeline(
    operator: Any, spoofed_claim: str
) -> None:
    response = signed_in(operator).get(f"/operations/occurrences/{spoofed_claim}/")
    assert response.status_code == 200
    source = response.content.decode()

    assert RLO not in source
    assert "worker<mark" in source and "\\u202e" in source


def test_the_reveal_filter_leaves_revealed_text_alone() -> None:
    from approvals.templatetags.console_text import reveal
    from approvals.web.text import reveal_html

    once = reveal_html(f"a{RLO}<b>")
    assert reveal(once) is once
    assert reveal(f"a{RLO}<b>") == once
    assert reveal(None) == ""


# --- currencies ------------------------------------------------------------------------------


@pytest.mark.parametrize("currency", ["XXX", "ZZZ", "XTS", "XAU", "XDR", "CHE", "USN", "eur"])
def test_codes_that_are_no_currency_are_refused(runtime: Runtime, currency: str) -> None:
    response = runtime.propose(arguments=refund(currency=currency))

    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["details"][0]["field"] == "arguments.currency"
    if currency.isupper():  # "eur" fails the contract's pattern first
        assert error["code"] == "unknown_currency"
        assert "ISO 4217" in error["message"]
    assert not Occurrence.objects.exists()
    assert not AuditEvent.objects.filter(kind="occurrence.proposed").exists()


def test_money_anywhere_in_the_arguments_must_be_in_a_currency() -> None:
    schema = {"type": "object", "additionalProperties": True}
    validate_arguments(schema, {"lines": [{"price_minor": 5, "currency": "SEK"}]})
    with pytest.raises(InputError) as raised:
        validate_arguments(schema, {"lines": [{"price_minor": 5, "currency": "XXX"}]})
    assert (raised.value.code, raised.value.field) == (
        "unknown_currency",
        "arguments.lines[0].currency",
    )
    # A currency with no amount beside it is not money: the contract decides.
    validate_arguments(schema, {"currency": "ZZZ"})


def test_minor_units_come_from_iso_4217() -> None:
    assert (minor_units("EUR"), minor_units("JPY"), minor_units("KWD")) == (2, 0, 3)
    assert minor_units("UYW") == 4
    assert minor_units("MRU") == 2
    for code in ("XXX", "ZZZ", "XTS", "XAU", "XAG", "XDR", "CLF", "BOV", ""):
        assert minor_units(code) is None, code
        assert currency_exponent(code) is None, code
    with pytest.raises(ValueError):
        format_money(100, "XXX")


def test_no_currency_is_shown_as_money() -> None:
    assert money_lines({"amount_minor": 50000, "currency": "XXX"}) == []
    assert money_lines({"amount_minor": 50000, "currency": "ZZZ"}) == []
    assert [x.text for x in money_lines({"amount_minor": 50000, "currency": "JPY"})] == [
        "JPY 50,000"
    ]


# --- the quorum per currency -----------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("amount_minor", "currency", "needed"),
    [
        (50000, "EUR", 1),
        (50001, "EUR", 2),
        (50001, "USD", 2),
        (40000, "GBP", 1),
        (40001, "GBP", 2),  # GBP 400.01, about 470 EUR
        # JPY has no minor unit: 50000 is 50,000 yen, about 300 EUR, no longer read as 500.00.
        (50000, "JPY", 1),
        (60000, "JPY", 1),
        (75000, "JPY", 1),
        (75001, "JPY", 2),
        # KWD has three decimals: 40.000 dinars. No threshold for KWD, so the quorum.
        (40000, "KWD", 2),
        (100, "SEK", 2),
        (1, "KRW", 2),
    ],
)
def test_the_refund_quorum_threshold_is_per_currency(
    amount_minor: int, currency: str, needed: int
) -> None:
    arguments = refund(amount_minor=amount_minor, currency=currency)
    assert contract().approvals_needed(arguments) == needed


@pytest.mark.django_db
def test_a_refund_without_its_currency_needs_the_quorum() -> None:
    assert contract().approvals_needed({"amount_minor": 100}) == 2


def test_a_small_refund_in_a_currency_without_threshold_needs_two_reviewers(
    runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    occurrence = Occurrence.objects.get(
        pk=propose(runtime, arguments=refund(amount_minor=40000, currency="KWD"))
    )
    digest = occurrence.proposals.get(is_current=True).action_digest

    first = occurrence_approve(occurrence=occurrence, reviewer=reviewer, seen_digest=digest)
    second = occurrence_approve(occurrence=occurrence, reviewer=second_reviewer, seen_digest=digest)

    assert (first.issued, first.needed) == (False, 2)
    assert second.issued


@pytest.mark.django_db
def test_the_rule_names_the_threshold_of_the_calls_currency() -> None:
    refund_contract = contract()
    jpy = quorum_rule(refund_contract, refund(currency="JPY"))
    assert "above the threshold of its currency (JPY 75,000 for this call's currency)" in jpy
    assert "EUR 500.00" in jpy and "GBP 400.00" in jpy
    kwd = quorum_rule(refund_contract, refund(currency="KWD"))
    assert 'none for "KWD", so this call needs the quorum' in kwd


def _money_contract(**fields: Any) -> ToolContract:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"amount_minor": {"type": "integer"}, "currency": {"type": "string"}},
    }
    defaults: dict[str, Any] = {
        "name": "pay_out",
        "json_schema": schema,
        "approvals_required": 2,
        "quorum_amount_argument": "amount_minor",
    }
    return ToolContract(**{**defaults, **fields})


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"quorum_currency_argument": "currency", "quorum_thresholds_minor": {"XXX": 1}}, "XXX"),
        ({"quorum_currency_argument": "currency", "quorum_thresholds_minor": {"EUR": -1}}, "EUR"),
        ({"quorum_currency_argument": "currency", "quorum_thresholds_minor": {"EUR": 1.5}}, "EUR"),
        ({"quorum_currency_argument": "currency", "quorum_thresholds_minor": []}, "JSON object"),
        (
            {"quorum_currency_argument": "currency", "quorum_threshold_minor": 50000},
            "per currency",
        ),
        ({"quorum_currency_argument": "amount_minor"}, "string argument"),
        ({"quorum_thresholds_minor": {"EUR": 1}, "quorum_threshold_minor": 1}, "currency argument"),
    ],
)
def test_a_contract_with_per_currency_thresholds_is_checked(
    fields: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        _money_contract(**fields).full_clean()
    assert problem in str(raised.value)


@pytest.mark.django_db
def test_a_contract_with_per_currency_thresholds_saves() -> None:
    pay_out = _money_contract(
        quorum_currency_argument="currency", quorum_thresholds_minor={"EUR": 1000}
    )
    pay_out.full_clean()
    assert pay_out.approvals_needed({"amount_minor": 1000, "currency": "EUR"}) == 1
    assert pay_out.approvals_needed({"amount_minor": 1000, "currency": "USD"}) == 2


@pytest.mark.django_db
def test_the_single_threshold_still_works_for_amounts_without_a_currency() -> None:
    legacy = _money_contract(quorum_threshold_minor=1000)
    legacy.full_clean()
    assert legacy.approvals_needed({"amount_minor": 1000}) == 1
    assert legacy.approvals_needed({"amount_minor": 1001}) == 2
