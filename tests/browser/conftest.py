"""Browser fixtures: Debian's Chromium driven by Playwright's sync API against live_server.

The session's one Playwright and Chromium (``playwright``, ``browser``) are in
tests/conftest.py, so that browser tests elsewhere (tests/gateway) share them: a second
sync Playwright started on the main thread while the first runs fails.

Playwright's sync API keeps an asyncio event loop on the main thread, and Django refuses
ORM calls from a thread with a running loop. The tests here call the ORM and the agent API
(through Django's test Client) between browser steps on purpose, so that guard is lifted
for this process before anything touches the database.
"""

from __future__ import annotations

import contextlib
import os

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    Request,
    expect,
)

from tests.conftest import PASSWORD

VIEWPORT = {"width": 1280, "height": 900}

# The decision panel polls about every 2 s; a state change must show within a few polls.
STATE_TIMEOUT_MS = 10_000

FINAL_STATES = {"consumed", "rejected", "revoked", "expired"}


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@dataclass
class Contexts:
    """Opens browser contexts (one per reviewer) and closes them after the test.

    When the test failed, every open page is saved as a PNG next to the test's tmp_path,
    which is the first thing to look at when a browser test breaks.
    """

    browser: Browser
    base_url: str
    artifacts: Path
    opened: list[BrowserContext] = field(default_factory=list)

    def new(self, *, width: int = 0, bypass_csp: bool = False) -> BrowserContext:
        """A context at the default viewport, or ``width`` px wide (640 is 1280 at 200%
        zoom). ``bypass_csp`` lets a test inject a script of its own (axe-core) into the
        page; the console's pages are checked against their CSP in other contexts."""
        viewport = {**VIEWPORT, "width": width} if width else VIEWPORT
        context = self.browser.new_context(
            viewport=viewport,  # type: ignore[arg-type]
            base_url=self.base_url,
            bypass_csp=bypass_csp,
        )
        context.set_default_timeout(STATE_TIMEOUT_MS)
        self.opened.append(context)
        return context

    def close(self, failed: bool) -> None:
        for n, context in enumerate(self.opened):
            if failed:
                for m, page in enumerate(context.pages):
                    # Best-effort evidence: a crashed page must not hide the real failure.
                    with contextlib.suppress(Exception):
                        page.screenshot(path=str(self.artifacts / f"context{n}-page{m}.png"))
            context.close()


@pytest.fixture
def contexts(
    request: pytest.FixtureRequest, browser: Browser, live_server: Any, tmp_path: Path
) -> Iterator[Contexts]:
    holder = Contexts(browser=browser, base_url=live_server.url, artifacts=tmp_path)
    yield holder
    report = getattr(request.node, "rep_call", None)
    holder.close(failed=bool(report is not None and report.failed))


@pytest.fixture
def page(contexts: Contexts) -> Page:
    return contexts.new().new_page()


def login(page: Page, username: str, password: str = PASSWORD) -> None:
    """Sign in through Django's login form, as a person would."""
    page.goto("/accounts/login/")
    page.locator("input[name=username]").fill(username)
    page.locator("input[name=password]").fill(password)
    with page.expect_navigation():
        page.locator("form [type=submit]").first.click()
    assert urlsplit(page.url).path != "/accounts/login/", "login failed: still on the login page"


def open_review(page: Page, occurrence_id: str) -> None:
    """Open an occurrence's review page and wait until its decision panel is there."""
    response = page.goto(f"/reviews/{occurrence_id}/")
    assert response is not None
    assert response.status == 200, f"review page answered {response.status}"
    expect(page.locator("#decision-panel")).to_have_count(1)
    expect(page.locator("#action-digest")).to_be_visible()


def panel(page: Page) -> Any:
    return page.locator("#decision-panel")


def wait_for_state(page: Page, state: str, timeout: int = STATE_TIMEOUT_MS) -> None:
    expect(panel(page)).to_have_attribute("data-state", state, timeout=timeout)


@dataclass
class NavigationLog:
    """Documents the page loads after this point, to prove an update came without one.

    history.pushState (htmx's hx-push-url) changes the URL without loading a document,
    so it is not counted; a reload, a redirect or a plain form post is.
    """

    page: Page
    urls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.page.on("request", lambda request: self._record(request))

    def _record(self, request: Request) -> None:
        if request.is_navigation_request() and request.frame == self.page.main_frame:
            self.urls.append(f"{request.method} {request.url}")


def track_navigations(page: Page) -> NavigationLog:
    return NavigationLog(page)


def propose(runtime: Any, tool: str = "issue_refund", **fields: Any) -> str:
    """Propose a tool call through the agent API; return the new occurrence id."""
    fields.setdefault("requested_by", "support-agent")
    response = runtime.propose(tool, **fields)
    assert response.status_code == 201, response.content
    occurrence_id: str = response.json()["occurrence_id"]
    return occurrence_id
