"""Issue 23: what ``check --deploy`` and the servers refuse of a careless deployment.

- ``ALLOWED_HOSTS=*``, ``CALLBACK_ALLOW_PRIVATE_HOSTS=1`` and ``CALLBACK_ALLOW_HTTP=1`` are
  deployment warnings (config/checks.py);
- the adapters' URLs no longer fall back to the sandbox's loopback address outside the
  demo: a missing ``PAYMENTS_URL`` is an error with DEBUG off (a warning with it on), a
  missing ``MESSAGES_WEBHOOK_URL`` a warning (tenants may have webhooks of their own);
- DEBUG, which serves a public development key and tracebacks, is for this machine only:
  the settings refuse it with a non-loopback ``ALLOWED_HOSTS``, and gunicorn refuses to bind
  anything but the loopback with it, before it listens.

Each runs in a subprocess with an environment of the test's choosing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.servers import free_port
from tests.test_settings_hardening import PRODUCTION_ENV, ROOT, clean_env, run_python

GUNICORN = Path(sys.executable).parent / "gunicorn"


def check(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env=clean_env(**variables),
        capture_output=True,
        text=True,
        timeout=120,
    )


def deploy_output(**overrides: str) -> str:
    result = check("--deploy", **(PRODUCTION_ENV | overrides))
    return result.stdout + result.stderr


# --- check --deploy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "check_id", "words"),
    [
        ({"ALLOWED_HOSTS": "*"}, "console.W001", "ALLOWED_HOSTS contains '*'"),
        ({"CALLBACK_ALLOW_PRIVATE_HOSTS": "1"}, "console.W002", "CALLBACK_ALLOW_PRIVATE_HOSTS"),
        ({"CALLBACK_ALLOW_HTTP": "1"}, "console.W003", "CALLBACK_ALLOW_HTTP is on"),
    ],
)
def test_check_deploy_warns_of_settings_that_open_the_console(
    variables: dict[str, str], check_id: str, words: str
) -> None:
    output = deploy_output(**variables)

    assert f"?: ({check_id}) {words}" in output, output
    # Not without --deploy: a development machine is not told off for them.
    plain = check(**(PRODUCTION_ENV | variables))
    assert check_id not in plain.stdout + plain.stderr


def test_the_warnings_fail_check_deploy_at_warning_level() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=clean_env(**(PRODUCTION_ENV | {"ALLOWED_HOSTS": "*"})),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0


def test_a_missing_payments_url_is_an_error_with_debug_off() -> None:
    environment = {k: v for k, v in PRODUCTION_ENV.items() if k != "PAYMENTS_URL"}

    # As bin/serve runs it: errors stop the start, warnings do not.
    result = check("--deploy", "--fail-level", "ERROR", **environment)

    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "(console.E001) PAYMENTS_URL is not set" in output


def test_a_missing_messages_webhook_url_is_a_warning() -> None:
    environment = {k: v for k, v in PRODUCTION_ENV.items() if k != "MESSAGES_WEBHOOK_URL"}

    result = check("--deploy", "--fail-level", "ERROR", **environment)

    assert result.returncode == 0
    assert "(console.W005) MESSAGES_WEBHOOK_URL is not set" in result.stdout + result.stderr


def test_makemigrations_needs_no_adapter_url() -> None:
    """bin/test runs it with DEBUG off and no demo: no deployment, no payments API."""
    environment = {k: v for k, v in PRODUCTION_ENV.items() if not k.endswith("_URL")}
    environment["DATABASE_URL"] = PRODUCTION_ENV["DATABASE_URL"]

    result = subprocess.run(
        [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
        cwd=ROOT,
        env=clean_env(**environment),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert "console.E001" not in result.stdout + result.stderr


def test_the_sandbox_is_the_adapters_default_only_where_the_demo_is_installed() -> None:
    shown = "import config.settings as s; print(repr(s.PAYMENTS_URL), repr(s.MESSAGES_WEBHOOK_URL))"
    production = {k: v for k, v in PRODUCTION_ENV.items() if not k.endswith("_URL")}
    production["DATABASE_URL"] = PRODUCTION_ENV["DATABASE_URL"]

    without = run_python(shown, **production)
    demo = run_python(shown, **(production | {"CONSOLE_DEMO": "1"}))
    debug = run_python(shown, DEBUG="1")

    assert without.stdout.split() == ["''", "''"], without.stderr
    sandbox = ["'http://127.0.0.1:8100'", "'http://127.0.0.1:8100/v1/messages'"]
    assert demo.stdout.split() == sandbox, demo.stderr
    assert debug.stdout.split() == sandbox, debug.stderr


def test_with_debug_a_missing_payments_url_is_only_a_warning() -> None:
    result = check("--deploy", "--fail-level", "ERROR", DEBUG="1", CONSOLE_DEMO="0")

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "(console.W004) PAYMENTS_URL is not set" in output


# --- DEBUG is for this machine only ------------------------------------------------------------


@pytest.mark.parametrize(
    "hosts", ["console.example.com", "*", "127.0.0.1,10.0.0.5", "localhost,.example.com"]
)
def test_debug_refuses_hosts_that_are_not_the_loopback(hosts: str) -> None:
    result = run_python("import config.settings", DEBUG="1", ALLOWED_HOSTS=hosts)

    assert result.returncode != 0
    assert "ImproperlyConfigured: DEBUG is on, and ALLOWED_HOSTS names" in result.stderr


@pytest.mark.parametrize(
    "hosts", ["", "127.0.0.1,localhost", "[::1],127.0.0.2,.localhost,app.localhost"]
)
def test_debug_on_the_loopback_still_loads(hosts: str) -> None:
    result = run_python("import config.settings", DEBUG="1", ALLOWED_HOSTS=hosts)

    assert result.returncode == 0, result.stderr


def gunicorn(*args: str, **variables: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(GUNICORN), "-c", "config/gunicorn.conf.py", "--workers", "1", *args],
        cwd=ROOT,
        env=clean_env(**variables),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def refused(process: subprocess.Popen[str], port: int) -> str:
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"gunicorn kept running:\n{output}")
    assert process.returncode != 0, output
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
    return output


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "10.1.2.3", "console.example.com"])
def test_gunicorn_refuses_debug_on_a_public_host(host: str) -> None:
    port = free_port()

    output = refused(gunicorn(DEBUG="1", HOST=host, PORT=str(port)), port)

    assert "refusing to serve DEBUG=1 on" in output


def test_gunicorn_refuses_debug_bound_on_its_command_line_or_set_with_e() -> None:
    port = free_port()

    output = refused(gunicorn("-e", "DEBUG=1", "-b", f"0.0.0.0:{port}"), port)

    assert f"refusing to serve DEBUG=1 on 0.0.0.0:{port}" in output


def test_gunicorn_serves_debug_on_the_loopback(tmp_path: Path) -> None:
    port = free_port()
    process = gunicorn(
        DEBUG="1",
        HOST="127.0.0.1",
        PORT=str(port),
        DATABASE_URL=f"sqlite:///{tmp_path / 'debug.sqlite3'}",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()[0]
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "gunicorn did not answer in 60 s"
                time.sleep(0.2)
        assert answer.status_code == 200
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_gunicorn_without_debug_binds_where_it_is_told() -> None:
    """The refusal is DEBUG's alone: the hook passes a production start (no DEBUG) on any
    host, which the serve tests start in full."""
    code = (
        "import importlib.util, types; "
        "spec = importlib.util.spec_from_file_location('conf', 'config/gunicorn.conf.py'); "
        "conf = importlib.util.module_from_spec(spec); spec.loader.exec_module(conf); "
        "server = types.SimpleNamespace(cfg=types.SimpleNamespace(bind=['0.0.0.0:8000'])); "
        "conf.on_starting(server); print('passed')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "passed", result.stderr
