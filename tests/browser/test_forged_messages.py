"""A forged ``messages`` cookie approves nothing.

The attack: whoever knows SECRET_KEY signs a messages cookie whose message is marked safe
HTML and holds an htmx form that posts an approval as soon as it loads; planted in a
reviewer's browser (a sibling subdomain, or plain HTTP), opening the inbox issued the
approval in the reviewer's name. The development key is public (it is in the
repository), so the server refuses to run with it outside DEBUG; messages are kept in the
session, so even a key the attacker knows plants nothing; and markup that reaches the
messages area anyway (a view that marked text safe) is shown as text, inside hx-disable.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from importlib import import_module
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from playwright.sync_api import BrowserContext, Page, Request, expect

from approvals.models import Approval, ApprovalVote, Occurrence
from config.settings import DEVELOPMENT_SECRET_KEY
from tests.browser.conftest import Contexts, login, propose
from tests.conftest import Runtime
from tests.test_settings_hardening import (
    PRODUCTION_ENV,
    ROOT,
    add_safe_message,
    clean_env,
    forged_messages_cookie,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,  # Chromium, and runserver processes
]

# Long enough for a load trigger to fire and for the inbox to poll once.
SETTLE_MS = 2500


def approve_on_load(occurrence_id: str, digest: str) -> str:
    return (
        f'<form hx-post="/reviews/{occurrence_id}/approve" '
        f'hx-vals=\'{{"action_digest": "{digest}"}}\' hx-trigger="load">'
        "Refund approved.</form>"
    )


def breaking_out(occurrence_id: str, digest: str) -> str:
    # Closes the message and its container first, so hx-disable alone would not hold.
    return "</p></div>" + approve_on_load(occurrence_id, digest)


@pytest.fixture
def pending(runtime: Runtime) -> tuple[str, str]:
    """A refund waiting for review, which one approval would issue: its id and digest."""
    occurrence_id = propose(runtime)
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    return occurrence_id, occurrence.proposals.get(is_current=True).action_digest


def record_requests(page: Page) -> list[Request]:
    requests: list[Request] = []
    page.on("request", lambda request: requests.append(request))
    return requests


def plant(context: BrowserContext, live_server: Any, value: str) -> None:
    context.add_cookies([{"name": "messages", "value": value, "url": live_server.url}])


def assert_nothing_approved(occurrence_id: str, requests: list[Request]) -> None:
    posted = [r.url for r in requests if urlsplit(r.url).path.endswith("/approve")]
    assert posted == [], "the page sent an approval"
    assert ApprovalVote.objects.count() == 0
    assert Approval.objects.count() == 0
    assert Occurrence.objects.get(pk=occurrence_id).status == "pending_review"


# --- the public key cannot run a server ---------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _runserver(tmp_path: Path, key: str) -> tuple[subprocess.Popen[str], int]:
    port = _free_port()
    env = clean_env(
        **PRODUCTION_ENV
        | {
            "SECRET_KEY": key,
            "ALLOWED_HOSTS": "127.0.0.1",
            # Its own empty database: startup reads the migration table, nothing else.
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        }
    )
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, port


def _serving(port: int, process: subprocess.Popen[str], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


def test_a_server_with_the_development_key_refuses_to_start(tmp_path: Path) -> None:
    process, port = _runserver(tmp_path, DEVELOPMENT_SECRET_KEY)
    try:
        serving = _serving(port, process)
    finally:
        process.kill()
        _, stderr = process.communicate(timeout=30)
    assert not serving, "the server accepted connections with the public development key"
    assert process.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is the development default" in stderr

    # The same command with a key of its own serves: the key is what stopped it.
    process, port = _runserver(tmp_path, PRODUCTION_ENV["SECRET_KEY"])
    try:
        assert _serving(port, process), "the control server did not start"
    finally:
        process.kill()
        process.communicate(timeout=30)


# --- a cookie signed with it is worth nothing ---------------------------------------------


def test_a_cookie_signed_with_the_development_key_is_ignored(
    contexts: Contexts, live_server: Any, reviewer: Any, pending: tuple[str, str]
) -> None:
    occurrence_id, digest = pending
    context = contexts.new()
    page = context.new_page()
    login(page, reviewer.username)
    assert settings.SECRET_KEY != DEVELOPMENT_SECRET_KEY
    plant(
        context,
        live_server,
        forged_messages_cookie(approve_on_load(occurrence_id, digest), key=DEVELOPMENT_SECRET_KEY),
    )
    requests = record_requests(page)

    page.goto("/reviews/")
    page.wait_for_timeout(SETTLE_MS)

    expect(page.locator(".messages")).to_have_count(0)
    assert_nothing_approved(occurrence_id, requests)


# --- nor one signed with a key the attacker knows -----------------------------------------


@pytest.mark.parametrize("payload", [approve_on_load, breaking_out])
@pytest.mark.parametrize("where", ["inbox", "review"])
def test_a_cookie_signed_with_a_known_key_is_ignored_too(
    contexts: Contexts,
    live_server: Any,
    reviewer: Any,
    pending: tuple[str, str],
    payload: Any,
    where: str,
) -> None:
    occurrence_id, digest = pending
    markup = payload(occurrence_id, digest)
    context = contexts.new()
    page = context.new_page()
    login(page, reviewer.username)
    # The live server's own key, as if it had leaked: messages are not read from a cookie.
    plant(context, live_server, forged_messages_cookie(markup, key=settings.SECRET_KEY))
    requests = record_requests(page)

    page.goto("/reviews/" if where == "inbox" else f"/reviews/{occurrence_id}/")
    page.wait_for_timeout(SETTLE_MS)

    assert_nothing_approved(occurrence_id, requests)
    expect(page.get_by_text("Refund approved.")).to_have_count(0)


# --- and markup that does reach the messages area is text ---------------------------------


@pytest.mark.parametrize("payload", [approve_on_load, breaking_out])
def test_a_message_marked_safe_cannot_approve_from_the_inbox(
    contexts: Contexts, live_server: Any, reviewer: Any, pending: tuple[str, str], payload: Any
) -> None:
    occurrence_id, digest = pending
    markup = payload(occurrence_id, digest)
    context = contexts.new()
    page = context.new_page()
    login(page, reviewer.username)
    session_key = next(
        c["value"] for c in context.cookies() if c["name"] == settings.SESSION_COOKIE_NAME
    )
    add_safe_message(import_module(settings.SESSION_ENGINE).SessionStore(session_key), markup)
    requests = record_requests(page)

    page.goto("/reviews/")
    page.wait_for_timeout(SETTLE_MS)

    assert_nothing_approved(occurrence_id, requests)
    messages = page.locator(".messages")
    expect(messages).to_have_count(1)
    expect(messages).to_contain_text(markup)  # shown as the text it is
    expect(messages).to_have_attribute("hx-disable", "")
    assert page.locator(f'[hx-post="/reviews/{occurrence_id}/approve"]').count() == 0
    assert page.locator(".messages form").count() == 0
