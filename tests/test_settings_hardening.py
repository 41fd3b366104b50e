"""What a careless deployment gets: the settings refuse a public or weak SECRET_KEY outside
DEBUG, read every flag strictly, and pass ``check --deploy`` under the production
environment docs/deploy.md documents. Also what a known key still cannot do: plant a
message (messages are kept in the session, not a cookie, and shown as text whatever
their origin), and that console pages are never stored by a cache.

Settings are loaded in a subprocess with an environment of the test's choosing, never the
environment of this run (which holds its own throwaway key)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib import messages
from django.contrib.messages.storage.cookie import CookieStorage
from django.contrib.messages.storage.session import SessionStorage
from django.contrib.sessions.backends.base import SessionBase
from django.http import HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.utils.safestring import mark_safe

from config.settings import DEVELOPMENT_SECRET_KEY, GENERATE_SECRET_KEY
from tests.conftest import PASSWORD

ROOT = Path(__file__).resolve().parent.parent

STRONG_KEY = secrets.token_urlsafe(50)

# The environment a production run needs, as docs/deploy.md lists it. Cookies are Secure by
# default outside DEBUG; the rest depends on the TLS proxy in front, so it is spelled out.
PRODUCTION_ENV = {
    "SECRET_KEY": STRONG_KEY,
    "ALLOWED_HOSTS": "console.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://console.example.com",
    "DATABASE_URL": "postgres://console@db.example.com/console",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "SECURE_SSL_REDIRECT": "1",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    # Where the adapters call: without the demo installed, nothing is assumed (config/checks.py).
    "PAYMENTS_URL": "https://payments.example.com",
    "MESSAGES_WEBHOOK_URL": "https://hooks.example.com/messages",
}

BOOLEANS = [
    "DEBUG",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
]
INTEGERS = ["SECURE_HSTS_SECONDS", "SESSION_COOKIE_AGE", "CONN_MAX_AGE"]

SHOWN = [
    "DEBUG",
    "SECRET_KEY",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SESSION_COOKIE_AGE",
    "SECURE_SSL_REDIRECT",
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "CSRF_TRUSTED_ORIGINS",
]
PRINT_SETTINGS = (
    "import json, config.settings as s; "
    f"print(json.dumps({{name: getattr(s, name) for name in {SHOWN!r}}}))"
)


def clean_env(**variables: str) -> dict[str, str]:
    """Only what a Python process needs, plus the variables given: nothing of this run's."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **variables}


def run_python(code: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean_env(**variables),
        capture_output=True,
        text=True,
        timeout=60,
    )


def load_settings(**variables: str) -> dict[str, Any]:
    result = run_python(PRINT_SETTINGS, **variables)
    assert result.returncode == 0, result.stderr
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


def refusal(**variables: str) -> str:
    """The last line of the traceback of a settings import that must fail."""
    result = run_python("import config.settings", **variables)
    assert result.returncode != 0, f"the settings loaded:\n{result.stdout}"
    assert "django.core.exceptions.ImproperlyConfigured" in result.stderr, result.stderr
    return result.stderr


# --- SECRET_KEY ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(None, id="unset"),
        pytest.param("", id="empty"),
        pytest.param(DEVELOPMENT_SECRET_KEY, id="development-default"),
        pytest.param(secrets.token_urlsafe(30), id="shorter-than-50"),
        pytest.param("abcd" * 20, id="four-distinct-characters"),
        pytest.param("django-insecure-" + secrets.token_urlsafe(50), id="django-insecure"),
    ],
)
def test_settings_refuse_a_missing_weak_or_public_key_outside_debug(key: str | None) -> None:
    variables = {} if key is None else {"SECRET_KEY": key}
    stderr = refusal(**variables)
    assert "SECRET_KEY" in stderr
    assert GENERATE_SECRET_KEY in stderr, "the message says how to make a key"
    if key:
        assert key not in stderr, "the refusal never echoes the key"


def test_a_debug_flag_that_does_not_parse_does_not_fall_back_to_production_either() -> None:
    # DEBUG=ture is neither on nor off: the process stops on it, before the key is judged.
    stderr = refusal(DEBUG="ture", SECRET_KEY=STRONG_KEY)
    assert "DEBUG='ture'" in stderr


def test_the_development_key_is_used_only_with_debug_on() -> None:
    assert load_settings(DEBUG="1")["SECRET_KEY"] == DEVELOPMENT_SECRET_KEY
    assert load_settings(DEBUG="0", SECRET_KEY=STRONG_KEY)["SECRET_KEY"] == STRONG_KEY


# --- strict parsing -----------------------------------------------------------------------


@pytest.mark.parametrize("name", BOOLEANS)
@pytest.mark.parametrize("value", ["ture", "2", "enabled", "y es"])
def test_a_boolean_that_does_not_parse_is_an_error_naming_the_variable(
    name: str, value: str
) -> None:
    stderr = refusal(**{"SECRET_KEY": STRONG_KEY, name: value})
    assert f"{name}={value!r} is not a boolean" in stderr


@pytest.mark.parametrize("name", INTEGERS)
@pytest.mark.parametrize("value", ["1y", "8h", "3.5", "-1"])
def test_an_integer_that_does_not_parse_is_an_error_naming_the_variable(
    name: str, value: str
) -> None:
    stderr = refusal(**{"SECRET_KEY": STRONG_KEY, name: value})
    assert f"{name}={value!r}" in stderr


@pytest.mark.parametrize(
    "value", ["X-Forwarded-Proto,https", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_PROTO,"]
)
def test_a_proxy_ssl_header_in_the_wrong_form_is_an_error(value: str) -> None:
    stderr = refusal(SECRET_KEY=STRONG_KEY, SECURE_PROXY_SSL_HEADER=value)
    assert "SECURE_PROXY_SSL_HEADER" in stderr
    assert "HTTP_X_FORWARDED_PROTO,https" in stderr, "the message shows the expected form"


@pytest.mark.parametrize("name", ["API_RATE_LIMIT_REDIS_URL", "NOTIFY_DRAIN_REDIS_URL"])
def test_a_redis_url_beside_the_broker_is_read_alike_for_each_use(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from config.environment import env_redis_url

    def read(broker: str) -> str:
        return env_redis_url(name, broker_url=broker, without="to do without")

    monkeypatch.delenv(name, raising=False)
    assert read("redis://broker:6379/1") == "redis://broker:6379/1"  # unset: the broker's
    assert read("amqp://guest@rabbit//") == ""  # a broker that is not Redis: none
    monkeypatch.setenv(name, "None")
    assert read("redis://broker:6379/1") == ""
    monkeypatch.setenv(name, "unix:///run/redis.sock")
    assert read("amqp://guest@rabbit//") == "unix:///run/redis.sock"
    monkeypatch.setenv(name, "http://cache:6379")
    with pytest.raises(ImproperlyConfigured, match=f'{name}=.* "none" to do without'):
        read("redis://broker:6379/1")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("true", True), ("On", True), ("0", False), ("no", False), ("", True)],
)
def test_booleans_read_the_usual_spellings_and_blank_means_the_default(
    value: str, expected: bool
) -> None:
    # The default of SESSION_COOKIE_SECURE outside DEBUG is on.
    loaded = load_settings(SECRET_KEY=STRONG_KEY, SESSION_COOKIE_SECURE=value)
    assert loaded["SESSION_COOKIE_SECURE"] is expected


def test_outside_debug_cookies_are_secure_and_sessions_last_a_working_day() -> None:
    loaded = load_settings(SECRET_KEY=STRONG_KEY)
    assert loaded["DEBUG"] is False
    assert loaded["SESSION_COOKIE_SECURE"] is True
    assert loaded["CSRF_COOKIE_SECURE"] is True
    assert loaded["SESSION_COOKIE_AGE"] == 8 * 60 * 60
    shorter = load_settings(SECRET_KEY=STRONG_KEY, SESSION_COOKIE_AGE="3600")
    assert shorter["SESSION_COOKIE_AGE"] == 3600


def test_the_production_environment_is_read_as_documented() -> None:
    loaded = load_settings(**PRODUCTION_ENV)
    assert loaded == {
        "DEBUG": False,
        "SECRET_KEY": STRONG_KEY,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SESSION_COOKIE_AGE": 8 * 60 * 60,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": True,
        "CSRF_TRUSTED_ORIGINS": ["https://console.example.com"],
    }


# --- check --deploy -----------------------------------------------------------------------


def check_deploy(**variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=clean_env(**variables),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_under_the_documented_production_environment() -> None:
    result = check_deploy(**PRODUCTION_ENV)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output
    assert "?: (security" not in output
    assert "System check identified no issues" in output


def test_check_deploy_cannot_even_start_with_the_development_key() -> None:
    result = check_deploy(**(PRODUCTION_ENV | {"SECRET_KEY": DEVELOPMENT_SECRET_KEY}))
    assert result.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is the development default" in result.stderr


# --- what a known key still cannot do -----------------------------------------------------

BREAKING_OUT = (
    '</p></div><form hx-post="/reviews/x/approve" hx-trigger="load"><b>Refund approved</b></form>'
)


def forged_messages_cookie(text: str, *, key: str) -> str:
    """A ``messages`` cookie holding one message marked safe HTML, signed with ``key`` by
    Django's own CookieStorage, as whoever knows the key could make it."""
    with override_settings(SECRET_KEY=key):
        storage = CookieStorage(RequestFactory().get("/"))
        storage.add(messages.INFO, mark_safe(text))  # the forgery under test
        response = HttpResponse()
        storage.update(response)
    return response.cookies[CookieStorage.cookie_name].value


def add_safe_message(session: SessionBase, text: str) -> None:
    """Put a message marked safe HTML in a session, as a view that wrongly trusted some
    text would: the one way left for markup to reach the messages area."""
    request = RequestFactory().get("/")
    request.session = session
    storage = SessionStorage(request)
    storage.add(messages.INFO, mark_safe(text))  # the mistake under test
    storage.update(HttpResponse())
    session.save()


@pytest.mark.django_db
def test_a_messages_cookie_is_not_read_even_when_signed_with_the_right_key(reviewer: Any) -> None:
    client = Client()
    assert client.login(username=reviewer.username, password=PASSWORD)
    client.cookies[CookieStorage.cookie_name] = forged_messages_cookie(
        BREAKING_OUT, key=settings.SECRET_KEY
    )

    html = client.get("/reviews/").content.decode()

    assert 'class="messages"' not in html
    assert "hx-post=" not in html
    assert "Refund approved" not in html


@pytest.mark.django_db
def test_a_message_marked_safe_is_still_shown_as_text_inside_hx_disable(reviewer: Any) -> None:
    client = Client()
    assert client.login(username=reviewer.username, password=PASSWORD)
    add_safe_message(client.session, BREAKING_OUT)

    html = client.get("/reviews/").content.decode()

    assert '<div class="messages" data-announce-load hx-disable>' in html
    assert "&lt;/p&gt;&lt;/div&gt;&lt;form hx-post=" in html, "the message is shown, escaped"
    assert "<form hx-post=" not in html


# --- caches -------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/accounts/login/", "/reviews/", "/reviews/?state=all"])
def test_console_pages_are_never_stored_by_a_cache(path: str, reviewer: Any) -> None:
    client = Client()
    if path != "/accounts/login/":
        assert client.login(username=reviewer.username, password=PASSWORD)
    response = client.get(path)
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]


@pytest.mark.django_db
def test_review_page_and_its_fragments_are_never_stored(reviewer: Any, approved: str) -> None:
    client = Client()
    assert client.login(username=reviewer.username, password=PASSWORD)
    for path, headers in [
        (f"/reviews/{approved}/", {}),
        (f"/reviews/{approved}/panel", {"HX-Request": "true"}),
    ]:
        response = client.get(path, headers=headers)
        assert response.status_code == 200, path
        assert "no-store" in response["Cache-Control"], path


def _manage(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'keyless.sqlite3'}"
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_makemigrations_runs_without_the_deployments_key(tmp_path: Path) -> None:
    """Writing migrations reads models and signs nothing: it needs no secret."""
    result = _manage("makemigrations", "--check", "--dry-run", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "No changes detected" in result.stdout


def test_every_other_command_still_refuses_without_a_key(tmp_path: Path) -> None:
    result = _manage("check", tmp_path=tmp_path)
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr
