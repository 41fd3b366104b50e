"""Issue 26's e-mails mark the agent-supplied requester as the review page does: a name that
looks like a console user's but is written differently (look-alike letters, invisible
characters, a confusable such as ``rn`` for ``m``) is flagged in the plain text and the
HTML, invisible characters are shown as ``\\uXXXX``, and a name no member has is said to
be unverified. Received by a real SMTP server (aiosmtpd)."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import Membership, NotificationEvent, Tenant
from approvals.notifications.content import message
from tests.approvals import smtp_fixture
from tests.approvals.smtp_fixture import Mailbox, parts
from tests.approvals.test_callbacks import Receiver, receiver
from tests.approvals.test_notifications import (
    Setup,
    drain,
    loopback_allowed,
    refund,
    routed,
    slack_messages,
)
from tests.conftest import Runtime, make_user

pytestmark = pytest.mark.django_db

smtp = smtp_fixture.smtp
__all__ = ["loopback_allowed", "receiver", "routed"]

CYRILLIC_I = "r\u0456ta"  # rita with a Cyrillic i
# The e-mails are read in rita's mailbox (support), so the requesters imitate ravi (another
# member): a request in rita's own name, or one that reads as hers, is not sent to her.
LOOK_RAVI = "rav\u0456"  # ravi with a Cyrillic i
HIDDEN_RAVI = "ravi\u200b"


def propose(runtime: Runtime, amount: int, ref: str, requested_by: str) -> str:
    answer = runtime.propose(arguments=refund(amount), client_ref=ref, requested_by=requested_by)
    assert answer.status_code == 201, answer.content
    return str(answer.json()["occurrence_id"])


def mails_by_requester(runtime: Runtime, smtp: Mailbox, *requesters: str) -> dict[str, Any]:
    """Propose a small refund (routed to support: rita) per requester, send, and return
    each request's (text, html) e-mail by requester."""
    ids = {
        propose(runtime, 1000 + n, f"ref-{n}", requested_by=name): name
        for n, name in enumerate(requesters)
    }
    assert drain() == ["delivered"] * len(requesters)
    found = {}
    for mail in smtp.to("rita@acme.test"):
        text, html = parts(mail)
        (occurrence_id,) = [pk for pk in ids if pk in text]
        found[ids[occurrence_id]] = (text, html)
    assert len(found) == len(requesters)
    return found


def test_a_requester_that_looks_like_a_console_user_is_marked_in_both_parts(
    runtime: Runtime, routed: Setup, smtp: Mailbox
) -> None:
    mails = mails_by_requester(runtime, smtp, LOOK_RAVI, HIDDEN_RAVI, "ravi")

    text, html = mails[LOOK_RAVI]
    assert (
        f'⚠ Look-alike requester: "{LOOK_RAVI}" looks like the console user ravi but is '
        "written differently: mixes scripts in one word: Latin + Cyrillic; U+0456 CYRILLIC "
        "SMALL LETTER BYELORUSSIAN-UKRAINIAN I looks like 'i'." in text
    )
    assert (
        "Look-alike requester:</strong> <mark>rav\u0456</mark> looks like the console user ravi"
        in html
    )
    assert "U+0456" in html

    # An invisible character is shown, not hidden, and counted.
    text, html = mails[HIDDEN_RAVI]
    assert "issue_refund requested by ravi\\u200b" in text
    assert '⚠ Look-alike requester: "ravi\\u200b" looks like the console user ravi' in text
    assert "1 invisible character" in text
    assert "<mark>ravi\\u200b</mark>" in html and "\u200b" not in text + html

    # The member's own name: nothing to mark.
    text, html = mails["ravi"]
    assert "Look-alike" not in text + html and "Requester " not in text
    assert "requester-note" not in html


def test_an_ascii_confusable_of_a_member_is_marked_too(
    tenant: Tenant, runtime: Runtime, routed: Setup, smtp: Mailbox
) -> None:
    mallory = make_user("mallory", tenant, Membership.Role.REVIEWER)
    mallory.email = "mallory@acme.test"
    mallory.save(update_fields=["email"])
    # "rn" reads as "m" (Unicode TR39's confusables): plain ASCII, and still a look-alike.
    text, html = mails_by_requester(runtime, smtp, "rnallory")["rnallory"]

    assert (
        '⚠ Look-alike requester: "rnallory" looks like the console user mallory but is '
        "written differently: its letters only look like theirs." in text
    )
    assert "<mark>rnallory</mark>" in html


def test_a_member_named_in_another_case_or_by_address_is_named_and_not_flagged(
    runtime: Runtime, routed: Setup, smtp: Mailbox
) -> None:
    mails = mails_by_requester(runtime, smtp, "Ravi", "ravi@acme.test")
    for name in ("Ravi", "ravi@acme.test"):
        text, html = mails[name]
        assert f'Requester "{name}": member ravi.' in text
        assert "Look-alike" not in text + html and "member ravi" in html


def test_a_name_no_member_has_is_unverified_and_escaped_in_html(
    runtime: Runtime, routed: Setup, smtp: Mailbox
) -> None:
    name = "<b>alice</b>"
    text, html = mails_by_requester(runtime, smtp, name)[name]

    assert (
        f'Requester "{name}": unverified: no member of Acme has this name or e-mail address; '
        "the agent says so, nothing confirms it." in text
    )
    assert "<em>&lt;b&gt;alice&lt;/b&gt;</em>: unverified" in html and "<b>alice</b>" not in html
    assert "Look-alike" not in text + html


def test_the_marks_travel_in_the_message_every_channel_gets(
    runtime: Runtime, routed: Setup
) -> None:
    propose(runtime, 1000, "hooked", requested_by=CYRILLIC_I)
    (event,) = NotificationEvent.objects.all()

    body = message(event)

    assert body["requested_by"] == CYRILLIC_I  # as the agent gave it, as before
    assert body["requester"] == {
        "shown": CYRILLIC_I,
        "member": "rita",
        "verified": True,
        "look_alike": True,
        "note": "looks like the console user rita but is written differently: mixes scripts "
        "in one word: Latin + Cyrillic; U+0456 CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I "
        "looks like 'i'",
    }


def test_another_tenants_member_is_not_a_member_here(
    runtime: Runtime, routed: Setup, smtp: Mailbox, other_tenant: Tenant
) -> None:
    make_user("gina", other_tenant, Membership.Role.ADMIN)
    text, _ = mails_by_requester(runtime, smtp, "g\u0456na")["g\u0456na"]
    assert "unverified: no member of Acme" in text and "Look-alike" not in text


def test_slack_marks_the_requester_as_the_e_mails_do(
    runtime: Runtime, routed: Setup, smtp: Mailbox, receiver: Receiver
) -> None:
    # EUR 900.00 goes to finance-leads, whose Slack webhook is the local receiver.
    propose(runtime, 90000, "big-look-alike", requested_by=CYRILLIC_I)
    propose(runtime, 90001, "big-stranger", requested_by="<!channel> alice")
    assert sorted(drain()) == ["delivered"] * 6  # two e-mails, Slack and webhook each

    look_alike, stranger = sorted(slack_messages(receiver), key=lambda text: "alice" in text)
    assert f"Requested by {CYRILLIC_I}\n:warning: *Look-alike requester:* looks like the " in (
        look_alike
    )
    assert "console user rita but is written differently" in look_alike
    # Escaped for Slack's mrkdwn: the agent's words cannot ping the channel.
    assert "Requested by &lt;!channel&gt; alice\n_Requester: unverified: no member" in stranger
    assert "<!channel>" not in stranger
