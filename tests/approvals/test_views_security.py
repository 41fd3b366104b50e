"""Agent-supplied text is inert in the console, the page shows exactly what the digest
covers, and every response carries a Content-Security-Policy without unsafe sources."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import rfc8785

from approvals.models import Occurrence
from tests.approvals.test_views_html import inline_code, parse, propose, signed_in
from tests.conftest import Runtime

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"
HTMX_ATTR = '<div hx-get="/reviews/" hx-trigger="load" hx-swap="outerHTML">x</div>'
BREAKOUT = "\"'></pre></textarea><svg onload=alert(3)>"


@pytest.fixture
def hostile(runtime: Runtime) -> str:
    return propose(
        runtime,
        tool="send_message",
        arguments={"to": "x@example.com", "subject": IMG + BREAKOUT, "body": SCRIPT + HTMX_ATTR},
        run_id="run-" + IMG,
        reason=SCRIPT + " " + HTMX_ATTR,
        requested_by="<b onmouseover=alert(4)>eve</b>",
    )


def test_hostile_text_is_escaped_everywhere_it_is_shown(reviewer: Any, hostile: str) -> None:
    client = signed_in(reviewer)
    for url in ("/reviews/", f"/reviews/{hostile}/", f"/reviews/{hostile}/panel"):
        response = client.get(url)
        html = response.content.decode()
        for payload in (SCRIPT, IMG, HTMX_ATTR, "<svg onload", "<b onmouseover"):
            assert payload not in html, (url, payload)
        page = parse(response)
        assert inline_code(page) == [], url
        # No element the agent wrote exists as markup: only the console's own tags.
        assert not [t for t in page.tags if t.tag in {"img", "svg", "b"}], url
        assert not [t for t in page.tags if t.tag == "script" and not t.attrs.get("src")]
    page = parse(client.get(f"/reviews/{hostile}/"))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.source
    assert page.text("agent-reason").startswith(SCRIPT)


def test_agent_content_is_wrapped_in_hx_disable(reviewer: Any, hostile: str) -> None:
    page = parse(signed_in(reviewer).get(f"/reviews/{hostile}/"))
    for element_id in ("agent-reason", "canonical-action"):
        assert "hx-disable" in page.by_id[element_id].attrs, element_id
    # Only the console's own elements carry htmx attributes.
    hx_elements = [t for t in page.tags if any(name.startswith("hx-") for name in t.attrs)]
    owners = {str(t.attrs.get("id") or t.tag) for t in hx_elements}
    assert "div" not in owners
    inbox = parse(signed_in(reviewer).get("/reviews/"))
    table = next(t for t in inbox.tags if t.tag == "table")
    assert "hx-disable" in table.attrs


def test_shown_action_redigests_to_the_shown_digest(reviewer: Any, hostile: str) -> None:
    page = parse(signed_in(reviewer).get(f"/reviews/{hostile}/"))
    shown = page.text("canonical-action")
    digest = page.text("action-digest")
    assert len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    assert hashlib.sha256(rfc8785.dumps(json.loads(shown))).hexdigest() == digest
    occurrence = Occurrence.objects.get(pk=hostile)
    assert digest == occurrence.proposals.get(is_current=True).action_digest
    assert page.by_id["canonical-action"].tag == "pre"


def test_invisible_and_bidi_characters_are_revealed_yet_redigest(
    runtime: Runtime, reviewer: Any
) -> None:
    # A right-to-left override would make "gnp.exe" read as "exe.png".
    subject = "Invoice \u202egnp.exe\u200b and\u00a0more"
    occurrence_id = propose(
        runtime,
        tool="send_message",
        arguments={"to": "x@example.com", "subject": subject, "body": "hi"},
    )
    page = parse(signed_in(reviewer).get(f"/reviews/{occurrence_id}/"))
    shown = page.text("canonical-action")
    for hidden in ("\u202e", "\u200b", "\u00a0"):
        assert hidden not in shown
    assert "\\u202e" in shown and "\\u200b" in shown and "\\u00a0" in shown
    assert json.loads(shown)["arguments"]["subject"] == subject
    digest = hashlib.sha256(rfc8785.dumps(json.loads(shown))).hexdigest()
    assert digest == page.text("action-digest")
    assert "3 invisible or direction-changing characters" in page.source
    assert len(page.find_all("mark", **{"class": "hidden-char"})) == 3


@pytest.mark.parametrize(
    "url", ["/accounts/login/", "/reviews/", "/reviews/{id}/", "/reviews/{id}/panel"]
)
def test_csp_header_allows_no_inline_or_eval(url: str, reviewer: Any, approved: str) -> None:
    client = signed_in(reviewer)
    response = client.get(url.format(id=approved))
    policy = response["Content-Security-Policy"]
    directives = dict(
        (part.split()[0], part.split()[1:]) for part in policy.split(";") if part.strip()
    )
    assert directives["script-src"] == ["'self'"]
    assert directives["style-src"] == ["'self'"]
    assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
    assert directives["object-src"] == ["'none'"]
    assert directives["frame-ancestors"] == ["'none'"]


def test_tokens_never_reach_a_page(
    reviewer: Any, runtime: Runtime, approved: str, token: str
) -> None:
    runtime.claim(token, "exec-1")
    runtime.claim(token, "exec-2")  # replayed: another audit event with the fingerprint
    client = signed_in(reviewer)
    for url in ("/reviews/?state=all", f"/reviews/{approved}/", f"/reviews/{approved}/panel"):
        html = client.get(url).content.decode()
        assert token not in html
        assert token[4:20] not in html


def test_approve_form_sends_the_stored_digest_of_a_hostile_action(
    reviewer: Any, hostile: str
) -> None:
    # Escaping changes how the action looks, never what the approval is bound to.
    client = signed_in(reviewer)
    page = parse(client.get(f"/reviews/{hostile}/"))
    sent = next(
        t.attrs["value"] for t in page.find_all("input") if t.attrs.get("name") == "action_digest"
    )
    assert sent == page.text("action-digest")
    response = client.post(f"/reviews/{hostile}/approve", {"action_digest": sent})
    assert response.status_code == 302
    assert Occurrence.objects.get(pk=hostile).status == Occurrence.Status.APPROVED


def test_the_favicon_is_served_not_a_404(client: Any) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    icon = client.get(response["Location"])
    assert icon.status_code == 200
    assert b"<svg" in b"".join(icon.streaming_content)
