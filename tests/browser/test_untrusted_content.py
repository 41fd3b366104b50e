"""What an agent writes is data: markup in arguments or in its reason stays inert text."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import ConsoleMessage, Page, Request

from tests.browser.conftest import login, open_review, panel, propose, wait_for_state
from tests.conftest import Runtime, approve

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

SCRIPT = "<script>window.__pwned=1</script>"
IMG = '<img src=x onerror="window.__pwned=1">'
HTMX = '<button hx-post="/reviews/x/approve" hx-trigger="load">x</button>'
PAYLOADS = [SCRIPT, IMG, HTMX]

# Installed before any page script runs, so it sees every violation from the first byte.
RECORD_CSP_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push({
    directive: e.violatedDirective, blocked: e.blockedURI, source: e.sourceFile,
    line: e.lineNumber, sample: e.sample,
  });
});
"""


def _normalized(text: str | None) -> str:
    return " ".join((text or "").split())


def _assert_inert(page: Page) -> None:
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("img[src=x]").count() == 0
    assert page.locator('[hx-post="/reviews/x/approve"]').count() == 0
    inline = page.locator('script:not([src]):not([type="application/json"])')
    assert inline.count() == 0, "no inline script: the CSP forbids them"
    assert page.evaluate("window.__cspViolations") == []


def test_markup_from_the_agent_is_shown_as_text_and_never_runs(
    page: Page, live_server: Any, runtime: Runtime, reviewer: Any, second_reviewer: Any
) -> None:
    arguments = {
        "to": "dana@example.com",
        "subject": " ".join(PAYLOADS),
        "body": "Hello Dana,\n" + "\n".join(PAYLOADS) + "\n",
    }
    reason = "Follow up. " + " ".join(PAYLOADS)
    occurrence_id = propose(
        runtime,
        "send_message",
        arguments=arguments,
        reason=reason,
        run_id=f"run-{IMG}",
        requested_by=f"agent-{SCRIPT}",
    )

    origin = urlsplit(live_server.url)
    requests: list[Request] = []
    console: list[ConsoleMessage] = []
    page.on("request", lambda request: requests.append(request))
    page.on("console", lambda message: console.append(message))
    page.add_init_script(RECORD_CSP_VIOLATIONS)

    login(page, reviewer.username)
    page.goto("/reviews/")
    _assert_inert(page)

    open_review(page, occurrence_id)
    _assert_inert(page)
    shown = json.loads(page.locator("#canonical-action").text_content() or "")
    assert shown == {"tool": "send_message", "arguments": arguments}
    assert _normalized(page.locator("#agent-reason").text_content()) == _normalized(reason)
    for payload in PAYLOADS:
        assert payload in (page.locator("#agent-reason").text_content() or "")

    # Agent text that arrives later, in a fragment htmx swaps in (and processes: a smuggled
    # hx-trigger="load" would fire then): the runtime's own execution id after its claim.
    execution_id = f"exec-{IMG}{HTMX}"
    approve(occurrence_id, second_reviewer)
    token = runtime.token(occurrence_id).json()["token"]
    claim = runtime.claim(token, execution_id, tool="send_message", arguments=arguments)
    assert claim.status_code == 200, claim.content
    wait_for_state(page, "consumed")
    page.wait_for_timeout(2500)  # one more poll cycle for anything the swap scheduled
    _assert_inert(page)
    assert execution_id in (panel(page).text_content() or "")
    assert any(urlsplit(r.url).path == f"/reviews/{occurrence_id}/panel" for r in requests), (
        "the panel should have been fetched by polling"
    )

    unexpected = []
    for request in requests:
        url = urlsplit(request.url)
        if url.scheme == "data":
            continue
        same_origin = (url.scheme, url.hostname, url.port) == (
            origin.scheme,
            origin.hostname,
            origin.port,
        )
        last_segment = url.path.rstrip("/").rsplit("/", 1)[-1]
        if (
            not same_origin
            or request.method not in {"GET", "POST"}
            or (request.method == "POST" and url.path != "/accounts/login/")
            or last_segment == "x"
            or url.path.startswith("/reviews/x")
        ):
            unexpected.append(f"{request.method} {request.url}")
    assert unexpected == []

    csp_console = [
        m.text
        for m in console
        if "Content Security Policy" in m.text or "Content-Security" in m.text
    ]
    assert csp_console == []
