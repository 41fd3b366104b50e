"""Shared fixtures: tenants, people with roles, runtime keys, and an API client per key."""

from __future__ import annotations

import importlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model
from django.test import Client
from playwright.sync_api import Browser, Playwright, sync_playwright

from approvals.access.runtime_keys import runtime_key_create
from approvals.access.tenancy import tenant_create
from approvals.models import Membership, Occurrence, RuntimeKey, Tenant, ToolContract
from approvals.reviews.decisions import ApproveOutcome, occurrence_approve

PASSWORD = "correct-horse-battery"


def pytest_configure(config: pytest.Config) -> None:
    """The guarantees this suite exists for (races between processes, the database clock,
    real workers) hold only on PostgreSQL; on SQLite those tests would skip and a run would
    go green without them. So a bare ``pytest`` on SQLite stops here and says what to do
    (once: a usage error, exit status 4)."""
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine and not os.environ.get("ALLOW_SQLITE_TESTS"):
        raise pytest.UsageError(
            "The suite runs on PostgreSQL (with Redis): run bin/test, which starts a "
            "throwaway PostgreSQL and Redis, or set DATABASE_URL=postgres://… and "
            "REDIS_URL=redis://…. ALLOW_SQLITE_TESTS=1 runs on SQLite anyway, skipping what "
            "needs PostgreSQL."
        )


# Fixtures that start processes for the test that uses them, directly or through another
# fixture: such a test is slow, and bin/test --fast skips it (docs/testing.md). A module whose
# every test is slow for another reason says so itself, with pytestmark.
SLOW_FIXTURES = frozenset(
    {
        "browser",  # Chromium, through Playwright (tests/browser/conftest.py)
        "broker",  # a real Redis for real Celery workers or bin/serve (worker_fixture.py)
        "workers",  # Celery worker and beat processes (worker_fixture.py)
        "asgi_server",  # gunicorn serving config/asgi.py (tests/serve/servers.py)
        "gateway_setup",  # manage.py mcp_gateway and its MCP server (tests/gateway)
    }
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


REFUND_ARGS: dict[str, Any] = {
    "payment_id": "pay_123",
    "amount_minor": 8000,
    "currency": "EUR",
    "reason": "Damaged parcel",
}


@dataclass
class Runtime:
    """An agent runtime: its key and an HTTP client that sends it."""

    key: RuntimeKey
    raw_key: str
    client: Client

    def post(self, path: str, body: Any = None, **extra: Any) -> Any:
        data = b"" if body is None else json.dumps(body)
        return self.client.post(path, data, content_type="application/json", **extra)

    def get(self, path: str, **extra: Any) -> Any:
        return self.client.get(path, **extra)

    def propose(
        self, tool: str = "issue_refund", arguments: dict[str, Any] | None = None, **fields: Any
    ) -> Any:
        body = {
            "tool": tool,
            "arguments": dict(REFUND_ARGS) if arguments is None else arguments,
            "run_id": "run-1",
            "reason": "The customer asked for it.",
            **fields,
        }
        return self.post("/api/v1/occurrences", body)

    def token(self, occurrence_id: str) -> Any:
        return self.post(f"/api/v1/occurrences/{occurrence_id}/token")

    def claim(
        self,
        token: str,
        execution_id: str,
        tool: str = "issue_refund",
        arguments: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Any:
        body = {
            "token": token,
            "action": {
                "tool": tool,
                "arguments": dict(REFUND_ARGS) if arguments is None else arguments,
            },
            "execution_id": execution_id,
            **fields,
        }
        return self.post("/api/v1/claims", body)


def make_user(username: str, tenant: Tenant, *roles: str) -> Any:
    user = get_user_model().objects.create_user(username=username, password=PASSWORD)
    for role in roles:
        Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def make_runtime(tenant: Tenant, name: str = "agent") -> Runtime:
    key, raw = runtime_key_create(tenant=tenant, name=name)
    return Runtime(key=key, raw_key=raw, client=Client(HTTP_AUTHORIZATION=f"Bearer {raw}"))


# Debian's Chromium, driven by Playwright's sync API (tests/browser/conftest.py has the
# pages' fixtures). One Playwright and one browser for the session, defined here once, so
# that every directory's browser tests share them: the sync API keeps its event loop on
# the main thread, and a second instance started beside it fails ("Playwright Sync API
# inside the asyncio loop"). A test that uses them is sync; an async client it needs runs
# in a thread of its own (tests/gateway/conftest.py).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture(scope="session")
def playwright() -> Iterator[Playwright]:
    instance = sync_playwright().start()
    yield instance
    instance.stop()


@pytest.fixture(scope="session")
def browser(playwright: Playwright) -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM}")
    # Never let Playwright fetch a browser of its own: always the system Chromium.
    instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield instance
    instance.close()


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    # The default hasher is slow on purpose; tests create many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def static_files_from_the_source(settings: Any) -> None:
    # Pages name static files as they are in static/, even in a checkout where
    # collectstatic wrote a manifest: live_server serves from static/, not STATIC_ROOT.
    # tests/serve checks the hashed, compressed files under gunicorn.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    settings.WHITENOISE_USE_FINDERS = settings.WHITENOISE_AUTOREFRESH = True


SHIPPED_CONTRACTS = importlib.import_module(
    "approvals.migrations.0013_currency_quorum_and_identifier_patterns"
).CONTRACTS


@pytest.fixture(autouse=True)
def shipped_contracts(request: pytest.FixtureRequest) -> None:
    """The contracts the data migration installs. A transactional test (races, browser)
    flushes every table when it ends, so later tests would otherwise find none."""
    uses_db = "_django_db_helper" in request.fixturenames
    if not uses_db and request.node.get_closest_marker("django_db") is None:
        return
    request.getfixturevalue("_django_db_helper")
    for contract in SHIPPED_CONTRACTS:
        if not ToolContract.objects.filter(name=contract["name"]).exists():
            ToolContract.objects.create(**contract)


@pytest.fixture
def tenant(db: Any) -> Tenant:
    return tenant_create(slug="acme", name="Acme")


@pytest.fixture
def other_tenant(db: Any) -> Tenant:
    return tenant_create(slug="globex", name="Globex")


@pytest.fixture
def reviewer(tenant: Tenant) -> Any:
    return make_user("rita", tenant, Membership.Role.REVIEWER)


@pytest.fixture
def second_reviewer(tenant: Tenant) -> Any:
    return make_user("ravi", tenant, Membership.Role.REVIEWER)


@pytest.fixture
def operator(tenant: Tenant) -> Any:
    return make_user("otto", tenant, Membership.Role.OPERATOR)


@pytest.fixture
def admin_user(tenant: Tenant) -> Any:
    return make_user("ada", tenant, Membership.Role.ADMIN)


@pytest.fixture
def runtime(tenant: Tenant) -> Runtime:
    return make_runtime(tenant)


@pytest.fixture
def other_runtime(other_tenant: Tenant) -> Runtime:
    return make_runtime(other_tenant, "other-agent")


def approve(occurrence_id: str, reviewer: Any) -> ApproveOutcome:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    digest = occurrence.proposals.get(is_current=True).action_digest
    return occurrence_approve(occurrence=occurrence, reviewer=reviewer, seen_digest=digest)


@pytest.fixture
def approved(runtime: Runtime, reviewer: Any) -> str:
    """An approved refund's occurrence id (token not yet picked up)."""
    response = runtime.propose()
    assert response.status_code == 201, response.content
    occurrence_id: str = response.json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    return occurrence_id


@pytest.fixture
def token(runtime: Runtime, approved: str) -> str:
    """The raw token of an approved refund, picked up once."""
    response = runtime.token(approved)
    assert response.status_code == 200, response.content
    value: str = response.json()["token"]
    return value


@pytest.fixture
def redis_rate_limit(settings: Any) -> Iterator[str]:
    """The API's rate limit counted in the Redis ``REDIS_URL`` names (as a deployment with
    a Redis broker counts it), under a key prefix of this test's own: the test databases of
    parallel workers reuse key ids. The test's keys are deleted when it ends."""
    url = os.environ.get("REDIS_URL", "")
    if not url:
        pytest.fail("REDIS_URL is not set: run bin/test, which starts a Redis.", pytrace=False)
    prefix = f"test-ratelimit:{uuid.uuid4().hex}"
    settings.API_RATE_LIMIT_REDIS_URL = url
    settings.API_RATE_LIMIT_REDIS_PREFIX = prefix
    yield url
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
