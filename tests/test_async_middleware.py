"""Issue 28: under ASGI no request hops to a thread for a middleware. Every middleware in
``MIDDLEWARE`` is async-capable (the console's own: trace id, no-store, error pages, and
static files through ``config.staticfiles.StaticFilesMiddleware``), so Django adapts none of
them, and the console's still do their work when the chain runs on the event loop."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.handlers.asgi import ASGIHandler
from django.test import AsyncClient

from tests.conftest import Runtime

UNKNOWN = "00000000-0000-4000-8000-000000000000"


def test_django_adapts_no_middleware_for_the_asgi_handler(caplog: Any, settings: Any) -> None:
    # Django logs each adaptation it makes (with DEBUG on) at DEBUG on django.request
    # ("Synchronous handler adapted for middleware ..."): a sync-only middleware is one.
    settings.DEBUG = True
    with caplog.at_level(logging.DEBUG, logger="django.request"):
        ASGIHandler().load_middleware(is_async=True)

    adapted = [r.getMessage() for r in caplog.records if "adapted for" in r.getMessage()]
    assert adapted == []


@pytest.mark.django_db
def test_the_consoles_middleware_works_on_the_event_loop(runtime: Runtime) -> None:
    headers = {"Authorization": f"Bearer {runtime.raw_key}", "X-Trace-Id": "asgi-trace-1"}

    answer = async_to_sync(AsyncClient().get)(f"/api/v1/occurrences/{UNKNOWN}", headers=headers)

    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"
    assert answer["X-Trace-Id"] == "asgi-trace-1"
    assert "no-store" in answer["Cache-Control"]


def _get_on_a_fresh_thread(path: str) -> Any:
    # A test run that started Playwright's sync API before this one leaves its event loop
    # running in the main thread, where async_to_sync refuses to start; a thread of its own
    # has none. (Only for a request that needs no test database: that lives on this thread.)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(async_to_sync(AsyncClient().get), path).result()


def test_static_files_are_served_on_the_event_loop() -> None:
    answer = _get_on_a_fresh_thread("/static/console/console.css")

    assert answer.status_code == 200
    body: Any = answer
    assert b":root" in b"".join(body.streaming_content)
    assert "no-store" not in answer.get("Cache-Control", "")
    assert answer.has_header("X-Trace-Id")
