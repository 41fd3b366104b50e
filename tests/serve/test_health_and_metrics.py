"""/healthz, /readyz and /metrics in this process: what each answers, who may read
metrics, and that the counters move where the console decides (the real servers are in
test_production.py and test_scale_out.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.management import call_command
from django.test import Client, override_settings

from approvals import metrics
from approvals.models import Command, Occurrence
from approvals.reviews.decisions import occurrence_reject
from config import health
from config.celery import app as celery_app
from config.staticfiles import ConsoleStaticFilesStorage
from reconciliation import dispatch
from tests.conftest import REFUND_ARGS, Runtime, approve

TOKEN = "a-metrics-token-for-tests"


def value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(autouse=True)
def fresh_migration_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "_migrations_ok_until", 0.0)


def assert_no_session(response: Any) -> None:
    assert "Set-Cookie" not in response.headers
    assert "Cookie" not in response.headers.get("Vary", "")


# --- health -------------------------------------------------------------------------------


def test_healthz_answers_without_the_database(client: Client) -> None:
    # No django_db mark: a query would fail the test.
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert_no_session(response)
    assert "no-store" in response["Cache-Control"]


@pytest.mark.django_db
def test_readyz_checks_database_broker_and_migrations(client: Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "ready",
        "checks": {"database": "ok", "broker": "ok", "migrations": "ok"},
    }
    assert_no_session(response)


@pytest.mark.django_db
def test_readyz_is_503_when_the_broker_is_unreachable(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A port nothing listens on: refused at once, within the check's timeout anyway.
    monkeypatch.setattr(celery_app.conf, "broker_url", "redis://127.0.0.1:1/0")
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not_ready"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("failed: ")


@pytest.mark.django_db
def test_readyz_is_503_while_a_migration_is_missing(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Pending:
        app_label, name = "approvals", "9999_from_the_next_release"

    monkeypatch.setattr(
        health.MigrationExecutor, "migration_plan", lambda self, targets: [(Pending, False)]
    )
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"] == (
        "failed: RuntimeError: 1 migration(s) not applied: approvals.9999_from_the_next_release"
    )


def test_the_probes_and_metrics_take_only_get(client: Client) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.post(path).status_code == 405


# --- who may read /metrics ----------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x"],
)
def test_metrics_refuse_a_missing_or_wrong_token(
    client: Client, settings: Any, authorization: str | None
) -> None:
    settings.METRICS_TOKEN = TOKEN
    headers = {} if authorization is None else {"Authorization": authorization}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"console_" not in response.content
    assert_no_session(response)


@pytest.mark.django_db
def test_metrics_are_off_without_a_token_setting(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    for authorization in ("", "Bearer ", "Bearer anything"):
        response = client.get("/metrics", HTTP_AUTHORIZATION=authorization)
        assert response.status_code == 404
        assert b"console_" not in response.content


@pytest.mark.django_db
def test_metrics_with_the_token(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    text = response.content.decode()
    for name in (
        "console_pending_reviews",
        'console_effects{state="not_sent"}',
        "console_metrics_database_up 1.0",
        "# HELP console_claims",
        "# HELP console_proposals",
        "# TYPE console_review_decision_seconds histogram",
        "# TYPE console_dispatch_latency_seconds histogram",
    ):
        assert name in text, name
    assert_no_session(response)


# --- what the counters count --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_counters_follow_proposals_decisions_claims_and_dispatch(
    runtime: Runtime, reviewer: Any, settings: Any
) -> None:
    proposed = value("console_proposals_total", tool="issue_refund", status="pending_review")
    repeated = value("console_proposals_total", tool="issue_refund", status="repeated")
    admitted = value("console_proposals_total", tool="lookup_order", status="auto_admitted")
    decided = value("console_review_decision_seconds_count", decision="approved")
    rejected = value("console_review_decision_seconds_count", decision="rejected")
    won = value("console_claims_total", decision="approved", reason="claimed")
    replayed = value(
        "console_claims_total", decision="replayed", reason="consumed_by_other_execution"
    )
    unknown = value("console_claims_total", decision="unknown_token", reason="no_such_token")
    dispatched = value("console_dispatch_latency_seconds_count")

    first = runtime.propose(client_ref="ref-1")
    assert first.status_code == 201
    assert runtime.propose(client_ref="ref-1").status_code == 200
    assert runtime.propose("lookup_order", {"order_id": "o-1"}).status_code == 201
    other = runtime.propose(arguments={**REFUND_ARGS, "payment_id": "pay_9"})
    assert value("console_proposals_total", tool="issue_refund", status="pending_review") == (
        proposed + 2
    )
    assert value("console_proposals_total", tool="issue_refund", status="repeated") == repeated + 1
    assert value("console_proposals_total", tool="lookup_order", status="auto_admitted") == (
        admitted + 1
    )

    # Pending reviews are read from the database at scrape time.
    settings.METRICS_TOKEN = TOKEN
    text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    assert "\nconsole_pending_reviews 2.0\n" in text

    occurrence_id = first.json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    occurrence_reject(
        occurrence=Occurrence.objects.get(pk=other.json()["occurrence_id"]),
        reviewer=reviewer,
        reason="not this one",
    )
    assert value("console_review_decision_seconds_count", decision="approved") == decided + 1
    assert value("console_review_decision_seconds_count", decision="rejected") == rejected + 1

    token = runtime.token(occurrence_id).json()["token"]
    assert runtime.claim(token, "exec-a").status_code == 200
    assert runtime.claim(token, "exec-b").status_code == 403
    assert runtime.claim("not-a-token", "exec-c").status_code == 403
    assert value("console_claims_total", decision="approved", reason="claimed") == won + 1
    assert (
        value("console_claims_total", decision="replayed", reason="consumed_by_other_execution")
        == replayed + 1
    )
    assert (
        value("console_claims_total", decision="unknown_token", reason="no_such_token")
        == unknown + 1
    )

    # Dispatch latency: observed when the first adapter call starts (phase 1 commits it).
    command = Command.objects.get(occurrence_id=occurrence_id)
    plan = dispatch.begin(command_id=command.pk)
    assert plan.invocation is not None and plan.invocation.number == 1
    assert value("console_dispatch_latency_seconds_count") == dispatched + 1

    text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    assert "\nconsole_pending_reviews 0.0\n" in text
    assert '\nconsole_effects{state="sending"} 1.0\n' in text


# --- static files -------------------------------------------------------------------------


def test_static_names_are_hashed_once_collectstatic_ran(tmp_path: Path, settings: Any) -> None:
    settings.STATIC_ROOT = str(tmp_path / "static")
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "config.staticfiles.ConsoleStaticFilesStorage"},
    }
    # Before collectstatic: the name as it is (a checkout, the demo, a benchmark).
    assert staticfiles_storage.url("console/console.css") == "/static/console/console.css"

    call_command("collectstatic", "--noinput", verbosity=0)
    manifest = json.loads((tmp_path / "static" / "staticfiles.json").read_text())
    hashed = manifest["paths"]["console/console.css"]
    assert hashed != "console/console.css" and hashed.startswith("console/console.")
    assert (tmp_path / "static" / f"{hashed}.gz").is_file()
    assert ConsoleStaticFilesStorage().url("console/console.css") == f"/static/{hashed}"
    # Strict once there is a manifest: a file it does not list is an error, not a 404.
    with pytest.raises(ValueError, match="Missing staticfiles manifest entry"):
        ConsoleStaticFilesStorage().url("console/not-collected.css")


@override_settings(DEBUG=True)
def test_static_names_stay_plain_with_debug(tmp_path: Path) -> None:
    assert ConsoleStaticFilesStorage(location=str(tmp_path)).url("console/console.css") == (
        "/static/console/console.css"
    )
