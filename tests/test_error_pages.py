"""The console's own error pages (config/errors.py): 404, 403 and 500 in the console's
layout with a way back to the inbox, with DEBUG off and on (bin/demo runs DEBUG on, where
Django would show its technical pages: every URL pattern, or a traceback). The agent API
keeps its JSON error envelope."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client

from tests.conftest import PASSWORD
from tests.error_urls import Broken

pytestmark = pytest.mark.django_db

INBOX_LINK = 'href="/reviews/"'


def _signed_in(user: Any) -> Client:
    client = Client(raise_request_exception=False)
    assert client.login(username=user.username, password=PASSWORD)
    return client


def _assert_console_page(response: Any, status: int, heading: str) -> str:
    assert response.status_code == status
    assert response["Content-Type"].startswith("text/html")
    body: str = response.content.decode()
    assert f"<h1>{heading}</h1>" in body
    assert INBOX_LINK in body and "Back to the inbox" in body
    # The console's layout: its stylesheet and header, not Django's technical page.
    assert "console/console.css" in body and 'class="topbar"' in body
    for technical in (
        "Using the URLconf",
        "Traceback",
        "technical_500",
        "Django tried",
        "DEBUG = True",
    ):
        assert technical not in body
    return body


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_an_unknown_page_is_the_consoles_404(settings: Any, reviewer: Any, debug: bool) -> None:
    settings.DEBUG = debug
    response = _signed_in(reviewer).get("/reviews/nothing-here/at-all")
    body = _assert_console_page(response, 404, "Not found")
    # Signed in, so the header shows who (the page has the request's context).
    assert reviewer.username in body
    assert "approvals:inbox" not in body  # no URL pattern names leak
    if not debug:  # django-csp leaves 404s and 500s under DEBUG without the header
        assert "Content-Security-Policy" in response.headers


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_a_request_of_no_tenant_of_mine_is_the_consoles_404(
    settings: Any, reviewer: Any, debug: bool
) -> None:
    """A view's Http404 (raised, with its own message) gets the same page."""
    settings.DEBUG = debug
    response = _signed_in(reviewer).get("/reviews/00000000-0000-4000-8000-000000000000/")
    body = _assert_console_page(response, 404, "Not found")
    assert "No such request in your tenants" not in body


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_a_page_my_role_may_not_see_is_the_consoles_403(
    settings: Any, reviewer: Any, debug: bool
) -> None:
    settings.DEBUG = debug
    response = _signed_in(reviewer).get("/operations/")
    body = _assert_console_page(response, 403, "Not allowed")
    assert "Only operators of a tenant can open the operations console." in body


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_a_view_that_raises_is_the_consoles_500_and_the_traceback_goes_to_the_log(
    settings: Any, reviewer: Any, debug: bool, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DEBUG = debug
    settings.ROOT_URLCONF = "tests.error_urls"
    client = _signed_in(reviewer)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = client.get("/reviews/broken/", HTTP_X_TRACE_ID="trace-500-test")
    body = _assert_console_page(response, 500, "Something went wrong")
    assert "secret internals" not in body and "<script>x" not in body
    assert "Broken" not in body
    # The reference the page gives is the trace id the log line carries.
    assert "<code>trace-500-test</code>" in body
    assert response["X-Trace-Id"] == "trace-500-test"
    errors = [
        r for r in caplog.records if r.name == "django.request" and r.levelno >= logging.ERROR
    ]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].exc_info is not None
    assert isinstance(errors[0].exc_info[1], Broken)


def test_under_debug_a_raising_view_still_reaches_the_test_clients_signal(
    settings: Any, reviewer: Any
) -> None:
    """Django's got_request_exception is still sent, so a test client that re-raises
    (the default) still sees the real exception under DEBUG."""
    settings.DEBUG = True
    settings.ROOT_URLCONF = "tests.error_urls"
    client = Client()
    assert client.login(username=reviewer.username, password=PASSWORD)
    with pytest.raises(Broken):
        client.get("/reviews/broken/")


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_the_api_keeps_its_json_envelope(settings: Any, runtime: Any, debug: bool) -> None:
    settings.DEBUG = debug
    settings.ROOT_URLCONF = "tests.error_urls"
    unknown = runtime.client.get("/api/v1/no-such-endpoint")
    assert unknown.status_code == 404
    assert unknown["Content-Type"] == "application/json"
    assert unknown.json()["error"]["code"] == "not_found"
    assert unknown.json()["error"]["message"] == "No such API endpoint."

    # A resource of no tenant of this key: the API's own 404, unchanged.
    missing = runtime.get("/api/v1/occurrences/00000000-0000-4000-8000-000000000000")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"

    client = Client(raise_request_exception=False)
    broken = client.get("/api/v1/broken")
    assert broken.status_code == 500
    assert broken["Content-Type"] == "application/json"
    assert broken.json()["error"]["code"] == "server_error"
    assert "secret internals" not in broken.content.decode()


def test_an_anonymous_404_offers_the_inbox_which_asks_to_sign_in(settings: Any, db: Any) -> None:
    settings.DEBUG = True
    response = Client().get("/no/such/page")
    body = _assert_console_page(response, 404, "Not found")
    assert "Sign out" not in body


def test_under_debug_a_missing_slash_still_redirects(settings: Any, reviewer: Any) -> None:
    """CommonMiddleware's APPEND_SLASH sees the 404 first and redirects, as without DEBUG."""
    settings.DEBUG = True
    response = _signed_in(reviewer).get("/reviews")
    assert response.status_code == 301
    assert response["Location"] == "/reviews/"
