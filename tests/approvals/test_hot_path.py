"""The agent's hot path without its fat: runtime keys remembered for at most a second,
the API past the console's session/CSRF/messages middleware, contract schemas compiled
once. None of it may change an answer."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from approvals.access import keycache
from approvals.access.runtime_keys import runtime_key_authenticate, runtime_key_deactivate
from approvals.canonical.schema import StrictValidator, contract_validator, validate_arguments
from approvals.models import Membership, RuntimeKey, Tenant, ToolContract
from tests.conftest import PASSWORD, Runtime, make_user

CURSOR = "/api/v1/audit/events/cursor"


def _key_reads(queries: CaptureQueriesContext) -> int:
    return sum(
        1
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith("SELECT") and '"approvals_runtimekey"' in q["sql"]
    )


class FakeClock:
    def __init__(self) -> None:
        self.at = 1000.0

    def __call__(self) -> float:
        return self.at


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(keycache, "now", fake)
    return fake


@pytest.fixture(autouse=True)
def empty_cache() -> Any:
    keycache.forget()
    yield
    keycache.forget()


# --- runtime keys: read at most once a second, refused within a second ------------------------

# Outside a transaction, as an HTTP request runs under gunicorn: the cache is used.
in_process = pytest.mark.django_db(transaction=True)


@in_process
def test_a_key_is_read_once_per_second_not_once_per_call(
    runtime: Runtime, clock: FakeClock
) -> None:
    with CaptureQueriesContext(connection) as first:
        assert runtime.get(CURSOR).status_code == 200
    clock.at += 0.5
    with CaptureQueriesContext(connection) as second:
        assert runtime.get(CURSOR).status_code == 200
    clock.at += 0.5
    with CaptureQueriesContext(connection) as third:
        assert runtime.get(CURSOR).status_code == 200

    assert (_key_reads(first), _key_reads(second), _key_reads(third)) == (1, 0, 1)


@in_process
def test_a_key_deactivated_elsewhere_is_refused_once_its_second_is_over(
    runtime: Runtime, clock: FakeClock
) -> None:
    assert runtime.get(CURSOR).status_code == 200
    # Another process (the admin, a shell) deactivates it: this process is not told.
    RuntimeKey.objects.filter(pk=runtime.key.pk).update(is_active=False)

    clock.at += 0.999
    assert runtime.get(CURSOR).status_code == 200  # the second it was read in
    clock.at += 0.001
    response = runtime.get(CURSOR)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
    assert runtime.propose().status_code == 401


@in_process
def test_a_deactivated_keys_next_call_after_a_second_is_401(runtime: Runtime) -> None:
    """The same on the real clock: deactivate, wait the promised second, call."""
    assert runtime.get(CURSOR).status_code == 200
    assert runtime.get(CURSOR).status_code == 200
    RuntimeKey.objects.filter(pk=runtime.key.pk).update(is_active=False)

    time.sleep(keycache.MAX_SECONDS)

    assert runtime.get(CURSOR).status_code == 401


@in_process
def test_the_process_that_deactivates_a_key_refuses_it_at_once(
    runtime: Runtime, tenant: Tenant, clock: FakeClock
) -> None:
    admin = make_user("ada", tenant, Membership.Role.ADMIN)
    assert runtime.get(CURSOR).status_code == 200

    assert runtime_key_deactivate(key=runtime.key, admin=admin)

    assert runtime.get(CURSOR).status_code == 401  # the same instant on the fake clock


@in_process
def test_the_cache_never_keeps_a_key_longer_than_a_second(
    runtime: Runtime, clock: FakeClock, settings: Any
) -> None:
    settings.RUNTIME_KEY_CACHE_SECONDS = 30
    assert keycache.seconds() == keycache.MAX_SECONDS == 1.0
    assert runtime.get(CURSOR).status_code == 200
    RuntimeKey.objects.filter(pk=runtime.key.pk).update(is_active=False)

    clock.at += 1.0

    assert runtime.get(CURSOR).status_code == 401


@in_process
def test_with_the_cache_off_every_call_reads_the_key(
    runtime: Runtime, clock: FakeClock, settings: Any
) -> None:
    settings.RUNTIME_KEY_CACHE_SECONDS = 0
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert runtime.get(CURSOR).status_code == 200
    assert _key_reads(queries) == 3


@in_process
def test_unknown_keys_are_not_cached(runtime: Runtime, clock: FakeClock) -> None:
    bogus = Client(HTTP_AUTHORIZATION="Bearer rk_" + "x" * 43)
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert bogus.get(CURSOR).status_code == 401
    assert _key_reads(queries) == 3
    assert keycache._entries == {}


@in_process
def test_a_cached_key_is_a_copy_per_request(runtime: Runtime, clock: FakeClock) -> None:
    assert runtime.get(CURSOR).status_code == 200
    first = runtime_key_authenticate(runtime.raw_key)
    assert first is not None
    first.name = "changed in one request"
    second = runtime_key_authenticate(runtime.raw_key)
    assert second is not None and second.name == runtime.key.name
    assert second.tenant.pk == runtime.key.tenant_id


def test_inside_a_transaction_the_key_is_read_every_time(runtime: Runtime) -> None:
    # The default test transaction: what a caller changed in its transaction is what counts.
    with CaptureQueriesContext(connection) as queries:
        for _ in range(2):
            assert runtime.get(CURSOR).status_code == 200
    assert _key_reads(queries) == 2
    RuntimeKey.objects.filter(pk=runtime.key.pk).update(is_active=False)
    assert runtime.get(CURSOR).status_code == 401


# --- the API goes past the console's session, CSRF, user and messages middleware -------------


def test_the_api_neither_reads_nor_sets_the_session(runtime: Runtime, tenant: Tenant) -> None:
    reviewer = make_user("rita", tenant, Membership.Role.REVIEWER)
    runtime.client.force_login(reviewer)  # a browser's session cookie rides along

    response = runtime.get(CURSOR)

    assert response.status_code == 200
    assert not response.cookies
    assert "Cookie" not in response.get("Vary", "")
    # The headers every answer keeps.
    assert "no-store" in response["Cache-Control"]
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"]
    assert response["X-Trace-Id"]


def test_the_api_needs_no_csrf_token_and_the_console_still_does(
    runtime: Runtime, tenant: Tenant
) -> None:
    strict = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {runtime.raw_key}")
    response = strict.post(
        "/api/v1/actions/canonicalize",
        b'{"tool": "lookup_order", "arguments": {"order_id": "ord_1"}}',
        content_type="application/json",
    )
    assert response.status_code == 200, response.content

    make_user("rita", tenant, Membership.Role.REVIEWER)
    browser = Client(enforce_csrf_checks=True)
    refused = browser.post("/accounts/login/", {"username": "rita", "password": PASSWORD})
    assert refused.status_code == 403  # no CSRF token: the console refuses the sign-in
    page = browser.get("/accounts/login/")
    assert "csrftoken" in page.cookies
    signed_in = browser.post(
        "/accounts/login/",
        {
            "username": "rita",
            "password": PASSWORD,
            "csrfmiddlewaretoken": page.cookies["csrftoken"].value,
        },
    )
    assert signed_in.status_code == 302
    inbox = browser.get("/reviews/")
    assert inbox.status_code == 200
    assert inbox.wsgi_request.user.get_username() == "rita"
    assert "Cookie" in inbox.get("Vary", "")


# --- contract schemas compiled once ------------------------------------------------------------


def _shipped_schemas() -> list[tuple[str, dict[str, Any]]]:
    from importlib import import_module

    shipped = import_module(
        "approvals.migrations.0013_currency_quorum_and_identifier_patterns"
    ).CONTRACTS
    return [(c["name"], c["json_schema"]) for c in shipped]


SCHEMAS = _shipped_schemas()

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.text(alphabet="AZaz09_-.@\n é", min_size=0, max_size=12),
    st.sampled_from(["EUR", "eur", "EURO", "ord_1", "a@b.cd", "a@b", "x" * 101, "abc\n"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@pytest.mark.parametrize(("name", "schema"), SCHEMAS, ids=[n for n, _ in SCHEMAS])
@hypothesis_settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_compiled_check_passes_exactly_what_jsonschema_passes(
    name: str, schema: dict[str, Any], data: st.DataObject
) -> None:
    keys = [*schema["properties"], "unknown"]
    arguments = data.draw(st.dictionaries(st.sampled_from(keys), _values, max_size=len(keys)))
    _, passes = contract_validator(schema)
    assert passes is not None, f"{name}: the shipped schema should compile"
    assert passes(arguments) == StrictValidator(schema).is_valid(arguments), arguments


def test_a_schema_with_a_keyword_not_compiled_is_left_to_jsonschema() -> None:
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string", "enum": ["a", "b"]}},
        "additionalProperties": False,
    }
    _, passes = contract_validator(schema)
    assert passes is None
    validate_arguments(schema, {"kind": "a"})
    with pytest.raises(Exception, match="is not one of"):
        validate_arguments(schema, {"kind": "c"})


def test_an_edited_contract_gets_validators_of_its_own(db: Any) -> None:
    contract = ToolContract.objects.get(name="lookup_order")
    schema = contract.json_schema
    validate_arguments(schema, {"order_id": "x" * 100})
    schema["properties"]["order_id"]["maxLength"] = 10  # the same dict, edited in place
    with pytest.raises(Exception, match="is too long"):
        validate_arguments(schema, {"order_id": "x" * 100})
