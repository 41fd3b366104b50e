"""The admin pages: bulk revocation (filters, preview, confirmation), revocation by
fingerprint, runtime keys (created once, deactivated), adapter credentials (never shown),
and audit events read-only in the Django admin. Who may do what, tenant by tenant."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import signing
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import (
    Approval,
    AuditEvent,
    Command,
    Membership,
    Occurrence,
    RuntimeKey,
    Tenant,
)
from approvals.web import revocations
from approvals.web.revocations import BATCH_SALT
from reconciliation.adapters import credential_for
from reconciliation.models import AdapterCredential, Interruption
from tests.approvals.test_views_html import Html, inline_code, parse, signed_in
from tests.conftest import PASSWORD, REFUND_ARGS, Runtime, approve, make_runtime, make_user

MESSAGE_ARGS = {"to": "dana@example.com", "subject": "Refund", "body": "On its way."}
SECRET = "sk_live_never-shown-9f2c1a"


def refund(amount: int, payment: str) -> dict[str, Any]:
    return dict(REFUND_ARGS, amount_minor=amount, payment_id=payment)


def issue(runtime: Runtime, reviewer: Any, tool: str = "issue_refund", **arguments: Any) -> str:
    """Propose and approve; the occurrence id of the issued approval."""
    args = arguments or (refund(8000, f"pay_{Occurrence.objects.count()}"))
    if tool == "send_message" and not arguments:
        args = dict(MESSAGE_ARGS, subject=f"Refund {Occurrence.objects.count()}")
    response = runtime.propose(tool, args)
    assert response.status_code == 201, response.content
    occurrence_id: str = response.json()["occurrence_id"]
    assert approve(occurrence_id, reviewer).issued
    return occurrence_id


def approval_of(occurrence_id: str) -> Approval:
    return Approval.objects.get(occurrence_id=occurrence_id)


def row_ids(page: Html) -> set[int]:
    return {
        int(str(t.attrs["data-approval-id"])) for t in page.tags if "data-approval-id" in t.attrs
    }


def batch_of(page: Html) -> str:
    [field] = [t for t in page.find_all("input") if t.attrs.get("name") == "batch"]
    return str(field.attrs["value"])


@pytest.fixture
def ada(tenant: Tenant) -> Any:
    """An admin of acme (and nothing else)."""
    return make_user("ada", tenant, Membership.Role.ADMIN)


@pytest.fixture
def gil(other_tenant: Tenant) -> Any:
    """An admin of globex."""
    return make_user("gil", other_tenant, Membership.Role.ADMIN)


@pytest.fixture
def second_key(tenant: Tenant) -> Runtime:
    return make_runtime(tenant, "batch-agent")


@pytest.fixture
def issued(
    runtime: Runtime,
    second_key: Runtime,
    other_runtime: Runtime,
    reviewer: Any,
    second_reviewer: Any,
    other_tenant: Tenant,
) -> dict[str, str]:
    """Issued approvals: in acme two refunds by rita (one proposed with the second key),
    a message by ravi; in globex a refund."""
    gina = make_user("gina", other_tenant, Membership.Role.REVIEWER)
    return {
        "refund": issue(runtime, reviewer, **refund(1250, "pay_a")),
        "batch_refund": issue(second_key, reviewer, **refund(49900, "pay_b")),
        "message": issue(runtime, second_reviewer, "send_message"),
        "theirs": issue(other_runtime, gina, **refund(500, "pay_c")),
    }


def states(occurrences: dict[str, str]) -> dict[str, str]:
    return {name: approval_of(pk).state for name, pk in occurrences.items()}


# --- who may open what --------------------------------------------------------------------

PAGES = ["/manage/revocations/", "/manage/keys/", "/manage/credentials/"]
POSTS = [
    "/manage/revocations/revoke",
    "/manage/revocations/fingerprint",
    "/manage/keys/create",
    "/manage/credentials/",
]


@pytest.mark.parametrize("role", [Membership.Role.REVIEWER, Membership.Role.OPERATOR])
def test_reviewers_and_operators_get_403_everywhere(tenant: Tenant, role: str) -> None:
    client = signed_in(make_user(f"just-{role}", tenant, role))
    for url in PAGES:
        assert client.get(url).status_code == 403, url
    for url in POSTS:
        assert client.post(url, {"reason": "x", "name": "k"}).status_code == 403, url
    key = make_runtime(tenant, "victim").key
    assert client.post(f"/manage/keys/{key.pk}/deactivate").status_code == 403
    assert RuntimeKey.objects.get(pk=key.pk).is_active


def test_signed_out_people_are_sent_to_sign_in(db: Any) -> None:
    for url in PAGES:
        response = Client().get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


def test_admin_pages_open_for_an_admin_with_the_admin_link_and_no_inline_code(ada: Any) -> None:
    client = signed_in(ada)
    for url in [*PAGES, "/manage/revocations/?preview=1"]:
        response = client.get(url)
        assert response.status_code == 200, url
        page = parse(response)
        assert inline_code(page) == [], url
        assert page.find_all("a", href="/manage/revocations/"), "the Admin link"


def test_the_admin_link_is_only_for_admins(reviewer: Any) -> None:
    page = parse(signed_in(reviewer).get("/reviews/"))
    assert not page.find_all("a", href="/manage/revocations/")


def test_forms_need_the_csrf_token(ada: Any, issued: dict[str, str]) -> None:
    client = signed_in(ada, enforce_csrf_checks=True)
    page = parse(client.get("/manage/revocations/?preview=1"))
    key = RuntimeKey.objects.filter(tenant__slug="acme").first()
    assert key is not None
    for url, data in [
        ("/manage/revocations/revoke", {"batch": batch_of(page), "reason": "x"}),
        ("/manage/revocations/fingerprint", {"fingerprint": "abc", "reason": "x"}),
        ("/manage/keys/create", {"name": "sneaky"}),
        (f"/manage/keys/{key.pk}/deactivate", {}),
        ("/manage/credentials/", {"tenant": "acme", "adapter": "payments", "secret": "s"}),
    ]:
        assert client.post(url, data).status_code == 403, url
    assert set(states(issued).values()) == {"issued"}
    assert RuntimeKey.objects.get(pk=key.pk).is_active
    assert not AdapterCredential.objects.exists()


def test_the_pages_are_get_only_and_actions_post_only(ada: Any) -> None:
    client = signed_in(ada)
    assert client.post("/manage/revocations/").status_code == 405
    assert client.get("/manage/revocations/revoke").status_code == 405
    assert client.get("/manage/keys/create").status_code == 405


# --- the preview ------------------------------------------------------------------------------


def test_the_preview_counts_and_lists_what_the_filters_select(
    ada: Any, issued: dict[str, str], reviewer: Any, second_key: Runtime
) -> None:
    client = signed_in(ada)
    ids = {name: approval_of(pk).pk for name, pk in issued.items()}

    everything = parse(client.get("/manage/revocations/?preview=1"))
    assert row_ids(everything) == {ids["refund"], ids["batch_refund"], ids["message"]}
    assert "3" in everything.text("preview-count")

    by_tool = parse(client.get("/manage/revocations/?preview=1&tool=issue_refund"))
    assert row_ids(by_tool) == {ids["refund"], ids["batch_refund"]}
    assert "Revoke 2 approvals" in by_tool.text("confirm-button")

    by_approver = parse(client.get("/manage/revocations/?preview=1&approver=ravi"))
    assert row_ids(by_approver) == {ids["message"]}
    assert "Revoke 1 approval" in by_approver.text("confirm-button")

    key = second_key.key.pk
    by_key = parse(client.get(f"/manage/revocations/?preview=1&runtime_key={key}"))
    assert row_ids(by_key) == {ids["batch_refund"]}

    Approval.objects.filter(pk=ids["refund"]).update(
        issued_at=timezone.now() - timedelta(minutes=5)
    )
    before = (timezone.now() - timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M")
    by_time = parse(client.get(f"/manage/revocations/?preview=1&issued_before={before}"))
    assert row_ids(by_time) == {ids["refund"]}
    assert set(states(issued).values()) == {"issued"}, "a preview revokes nothing"


def test_the_preview_shows_each_approval_for_people(ada: Any, issued: dict[str, str]) -> None:
    approval = approval_of(issued["batch_refund"])
    page = parse(signed_in(ada).get("/manage/revocations/?preview=1&tool=issue_refund"))
    source = page.source
    assert "EUR 499.00" in source and "EUR 12.50" in source
    assert "batch-agent" in source and "rita" in source
    assert approval.issued_at.strftime("%H:%M:%S") in source
    assert approval.expires_at.strftime("%H:%M:%S") in source
    assert f'href="/reviews/{approval.occurrence_id}/"' in source


def test_consumed_expired_and_revoked_approvals_are_never_previewed(
    ada: Any, issued: dict[str, str], runtime: Runtime
) -> None:
    token = runtime.token(issued["refund"]).json()["token"]
    assert runtime.claim(token, "exec-1", arguments=refund(1250, "pay_a")).status_code == 200
    # Expired well before this test's transaction began: on PostgreSQL the guard's clock is
    # the transaction's start, so "a second ago" is not yet past when the setup was slow.
    Approval.objects.filter(occurrence_id=issued["message"]).update(
        expires_at=timezone.now() - timedelta(hours=1), issued_at=timezone.now() - timedelta(1)
    )
    page = parse(signed_in(ada).get("/manage/revocations/?preview=1"))
    assert row_ids(page) == {approval_of(issued["batch_refund"]).pk}


def test_an_admin_never_previews_another_tenants_approvals(
    gil: Any, issued: dict[str, str]
) -> None:
    page = parse(signed_in(gil).get("/manage/revocations/?preview=1"))
    assert row_ids(page) == {approval_of(issued["theirs"]).pk}
    # Another tenant's key as a filter is not a choice.
    acme_key = RuntimeKey.objects.filter(tenant__slug="acme").first()
    assert acme_key is not None
    response = signed_in(gil).get(f"/manage/revocations/?preview=1&runtime_key={acme_key.pk}")
    assert response.status_code == 200
    assert row_ids(parse(response)) == set()
    assert "not one of the available choices" in response.content.decode()


def test_an_invalid_time_is_an_error_not_an_empty_preview(ada: Any, issued: dict[str, str]) -> None:
    page = parse(signed_in(ada).get("/manage/revocations/?preview=1&issued_before=yesterday"))
    assert not page.has("preview")
    assert "YYYY-MM-DD HH:MM" in page.source


# --- the confirmation -----------------------------------------------------------------------


def test_confirmation_revokes_exactly_the_previewed_approvals(
    ada: Any, issued: dict[str, str], runtime: Runtime, reviewer: Any
) -> None:
    client = signed_in(ada)
    preview = parse(client.get("/manage/revocations/?preview=1&tool=issue_refund"))
    token = runtime.token(issued["refund"]).json()["token"]
    # Issued after the preview, matching its filters: not part of what the admin saw.
    later = issue(runtime, reviewer, **refund(700, "pay_late"))

    response = client.post(
        "/manage/revocations/revoke",
        {"batch": batch_of(preview), "reason": "Compromised agent run"},
    )

    assert response.status_code == 302
    assert response["Location"].startswith("/manage/revocations/batches/")
    assert states(issued) == {
        "refund": "revoked",
        "batch_refund": "revoked",
        "message": "issued",
        "theirs": "issued",
    }
    assert approval_of(later).state == "issued"
    events = AuditEvent.objects.filter(kind="approval.revoked")
    assert events.count() == 2
    assert {e.actor for e in events} == {"ada"}
    assert {e.data["reason"] for e in events} == {"Compromised agent run"}
    assert len({e.data["batch"] for e in events}) == 1
    # A claim of a revoked approval gets "revoked".
    claim = runtime.claim(token, "exec-1", arguments=refund(1250, "pay_a"))
    assert (claim.status_code, claim.json()["decision"]) == (403, "revoked")

    result = parse(client.get(response["Location"]))
    assert "Revoked 2 of the 2 approvals you previewed" in result.text("result-summary")
    assert "1 approval matching the same filters is issued now" in result.text("result-newer")
    outcomes = {
        int(str(t.attrs["data-approval-id"])): t.attrs.get("data-outcome")
        for t in result.tags
        if "data-approval-id" in t.attrs
    }
    assert outcomes == {
        approval_of(issued["refund"]).pk: "revoked",
        approval_of(issued["batch_refund"]).pk: "revoked",
    }


def test_a_previewed_approval_consumed_before_confirmation_is_left_and_explained(
    ada: Any, issued: dict[str, str], runtime: Runtime
) -> None:
    client = signed_in(ada)
    preview = parse(client.get("/manage/revocations/?preview=1&tool=issue_refund"))
    token = runtime.token(issued["refund"]).json()["token"]
    claim = runtime.claim(token, "exec-9", arguments=refund(1250, "pay_a"))
    command = Command.objects.get(pk=claim.json()["command_id"])

    response = client.post(
        "/manage/revocations/revoke", {"batch": batch_of(preview), "reason": "incident"}
    )

    assert states(issued)["refund"] == "consumed"
    assert states(issued)["batch_refund"] == "revoked"
    result = parse(client.get(response["Location"]))
    assert "Revoked 1 of the 2" in result.text("result-summary")
    assert "1 was not revoked" in result.text("result-skipped")
    assert str(command.pk) in result.source
    assert "exec-9" in result.source
    assert f"({command.state})" in result.source


def test_confirmation_needs_a_reason_and_keeps_the_preview(
    ada: Any, issued: dict[str, str]
) -> None:
    client = signed_in(ada)
    preview = parse(client.get("/manage/revocations/?preview=1&tool=issue_refund"))

    response = client.post("/manage/revocations/revoke", {"batch": batch_of(preview)})

    assert response.status_code == 422
    page = parse(response)
    assert "Say why" in page.text("confirm-error")
    assert row_ids(page) == row_ids(preview)
    assert set(states(issued).values()) == {"issued"}
    assert not AuditEvent.objects.filter(kind="approval.revoked").exists()


def test_a_forged_or_foreign_confirmation_revokes_nothing(
    ada: Any, gil: Any, issued: dict[str, str]
) -> None:
    acme_ids = [approval_of(issued[n]).pk for n in ("refund", "batch_refund", "message")]
    acme = Tenant.objects.get(slug="acme")
    # Not signed by the console.
    forged = signed_in(gil).post(
        "/manage/revocations/revoke", {"batch": "x" * 40, "reason": "mine now"}
    )
    assert forged.status_code == 400
    # Signed (as if a preview had listed acme's approvals) for an admin of globex only.
    payload = {
        "u": gil.pk,
        "t": [acme.pk],
        "f": {"tool": "", "approver": "", "key": None, "before": None},
        "q": "preview=1",
        "ids": acme_ids,
    }
    batch = signing.dumps(payload, salt=BATCH_SALT, compress=True)
    response = signed_in(gil).post(
        "/manage/revocations/revoke", {"batch": batch, "reason": "mine now"}
    )
    assert response.status_code == 302
    # Another person's confirmation is refused.
    stolen = signed_in(ada).post(
        "/manage/revocations/revoke", {"batch": batch, "reason": "not mine"}
    )
    assert stolen.status_code == 400
    assert set(states(issued).values()) == {"issued"}


def test_an_old_preview_is_refused(
    ada: Any, issued: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = signed_in(ada)
    preview = parse(client.get("/manage/revocations/?preview=1&tool=issue_refund"))
    monkeypatch.setattr(revocations, "PREVIEW_MAX_AGE", -1)

    response = client.post(
        "/manage/revocations/revoke", {"batch": batch_of(preview), "reason": "late"}
    )

    assert response.status_code == 302
    assert response["Location"] == "/manage/revocations/?preview=1&tool=issue_refund"
    assert set(states(issued).values()) == {"issued"}


def test_preview_queries_do_not_grow_with_rows(
    ada: Any, runtime: Runtime, reviewer: Any, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(ada)
    for n in range(3):
        issue(runtime, reviewer, **refund(100 + n, f"pay_few_{n}"))
    url = "/manage/revocations/?preview=1"
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    few = len(captured.captured_queries)  # now: the next request clears the log

    for n in range(30):
        issue(runtime, reviewer, **refund(200 + n, f"pay_many_{n}"))
    with django_assert_max_num_queries(few):
        response = client.get(url)
    assert response.status_code == 200
    assert len(row_ids(parse(response))) == 33


def test_result_page_queries_do_not_grow_with_rows(
    ada: Any, runtime: Runtime, reviewer: Any, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(ada)

    def revoke_all() -> str:
        page = parse(client.get("/manage/revocations/?preview=1"))
        response = client.post(
            "/manage/revocations/revoke", {"batch": batch_of(page), "reason": "r"}
        )
        return str(response["Location"])

    issue(runtime, reviewer, **refund(100, "pay_one"))
    location = revoke_all()
    with CaptureQueriesContext(connection) as captured:
        assert client.get(location).status_code == 200
    few = len(captured.captured_queries)
    for n in range(20):
        issue(runtime, reviewer, **refund(200 + n, f"pay_r_{n}"))
    location = revoke_all()
    with django_assert_max_num_queries(few):
        response = client.get(location)
    assert response.status_code == 200
    result = parse(response)
    assert len(row_ids(result)) == 20
    assert "Revoked 20 of the 20 approvals you previewed." in result.text("result-summary")


# --- one approval by fingerprint -----------------------------------------------------------


def test_revoke_by_fingerprint(ada: Any, issued: dict[str, str], runtime: Runtime) -> None:
    token = runtime.token(issued["refund"]).json()["token"]
    fingerprint = approval_of(issued["refund"]).fingerprint
    client = signed_in(ada)

    response = client.post(
        "/manage/revocations/fingerprint", {"fingerprint": fingerprint, "reason": "leaked"}
    )

    assert response.status_code == 302
    assert states(issued)["refund"] == "revoked"
    assert f"Revoked approval {fingerprint}" in client.get(response["Location"]).content.decode()
    claim = runtime.claim(token, "exec-1", arguments=refund(1250, "pay_a"))
    assert claim.json()["decision"] == "revoked"


def test_revoke_by_the_fingerprint_of_a_token_a_redelivery_retired(
    ada: Any, issued: dict[str, str], runtime: Runtime
) -> None:
    path = f"/api/v1/occurrences/{issued['refund']}/token"
    retired = runtime.post(path, {"execution_id": "exec-1"}).json()["fingerprint"]
    token = runtime.post(path, {"execution_id": "exec-1"}).json()["token"]
    assert approval_of(issued["refund"]).fingerprint != retired

    response = signed_in(ada).post(
        "/manage/revocations/fingerprint", {"fingerprint": retired, "reason": "leaked log"}
    )

    assert response.status_code == 302
    assert states(issued)["refund"] == "revoked"
    claim = runtime.claim(token, "exec-1", arguments=refund(1250, "pay_a"))
    assert claim.json()["decision"] == "revoked"


def test_revoking_a_consumed_approval_is_refused_naming_its_command_and_effect(
    ada: Any, issued: dict[str, str], runtime: Runtime
) -> None:
    token = runtime.token(issued["refund"]).json()["token"]
    claim = runtime.claim(token, "exec-7", arguments=refund(1250, "pay_a"))
    command = Command.objects.get(pk=claim.json()["command_id"])
    Command.objects.filter(pk=command.pk).update(state=Command.State.OUTCOME_UNKNOWN)
    fingerprint = approval_of(issued["refund"]).fingerprint

    response = signed_in(ada).post(
        "/manage/revocations/fingerprint", {"fingerprint": fingerprint, "reason": "late"}
    )

    assert response.status_code == 409
    message = parse(response).text("fingerprint-message")
    assert str(command.pk) in message
    assert "exec-7" in message
    assert "outcome unknown (outcome_unknown)" in message
    assert "Consumed stays consumed" in message
    assert approval_of(issued["refund"]).state == "consumed"
    assert not AuditEvent.objects.filter(kind="approval.revoked").exists()


def test_another_tenants_fingerprint_is_no_approval(
    gil: Any, issued: dict[str, str], runtime: Runtime
) -> None:
    runtime.token(issued["refund"])
    fingerprint = approval_of(issued["refund"]).fingerprint

    response = signed_in(gil).post(
        "/manage/revocations/fingerprint", {"fingerprint": fingerprint, "reason": "x"}
    )

    assert response.status_code == 404
    assert "No approval of your tenants" in response.content.decode()
    assert states(issued)["refund"] == "issued"


def test_the_review_pages_single_revoke_still_works(ada: Any, issued: dict[str, str]) -> None:
    response = signed_in(ada).post(f"/reviews/{issued['refund']}/revoke", {"reason": "stop"})
    assert response.status_code == 302
    assert states(issued)["refund"] == "revoked"


# --- runtime keys ---------------------------------------------------------------------------


def test_a_created_key_is_shown_once_and_never_again(ada: Any, tenant: Tenant) -> None:
    client = signed_in(ada)

    created = client.post("/manage/keys/create", {"name": "night-shift"})

    # Post/redirect/get: reloading the page that shows the key never creates another.
    key = RuntimeKey.objects.get(name="night-shift")
    assert created.status_code == 302
    assert created["Location"] == f"/manage/keys/{key.pk}/created"
    # Across the redirect the session holds the key encrypted, never in the clear.
    in_session = str(dict(client.session))
    response = client.get(created["Location"])
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    page = parse(response)
    raw = page.text("new-key").strip()
    assert raw not in in_session
    assert raw.startswith(key.prefix) and len(raw) > 30
    assert page.source.count(raw) == 1
    assert key.tenant == tenant
    listing = client.get("/manage/keys/").content.decode()
    assert "night-shift" in listing and key.prefix in listing
    assert raw not in listing
    assert raw not in str(dict(client.session))
    # Shown once: a reload of the page says so, and the key is not on it.
    again = client.get(created["Location"])
    assert again.status_code == 200 and raw not in again.content.decode()
    assert "cannot show it again" in parse(again).text("key-gone")
    assert RuntimeKey.objects.filter(name="night-shift").count() == 1
    event = AuditEvent.objects.get(kind="runtime_key.created")
    assert event.actor == "ada" and raw not in str(event.data)
    assert key.key_hash != raw
    # The key works.
    works = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/api/v1/audit/events")
    assert works.status_code == 200


def test_creating_a_key_refuses_a_taken_or_empty_name(ada: Any, runtime: Runtime) -> None:
    client = signed_in(ada)
    taken = client.post("/manage/keys/create", {"name": runtime.key.name})
    assert taken.status_code == 422
    assert "already has a runtime key named" in taken.content.decode()
    empty = client.post("/manage/keys/create", {"name": "   "})
    assert empty.status_code == 422
    assert RuntimeKey.objects.count() == 1


def test_the_key_list_shows_prefix_name_and_last_use(ada: Any, runtime: Runtime) -> None:
    client = signed_in(ada)
    assert "never" in client.get("/manage/keys/").content.decode()

    runtime.propose()

    key = RuntimeKey.objects.get(pk=runtime.key.pk)
    assert key.last_used_at is not None
    listing = client.get("/manage/keys/").content.decode()
    assert runtime.key.prefix in listing and runtime.key.name in listing
    assert "just now" in listing


def test_last_used_is_written_at_most_once_a_minute(runtime: Runtime) -> None:
    runtime.propose()
    first = RuntimeKey.objects.get(pk=runtime.key.pk).last_used_at
    with CaptureQueriesContext(connection) as captured:
        runtime.get("/api/v1/audit/events")
    assert not [q for q in captured.captured_queries if 'UPDATE "approvals_runtimekey"' in q["sql"]]
    assert RuntimeKey.objects.get(pk=runtime.key.pk).last_used_at == first

    old = timezone.now() - timedelta(minutes=2)
    RuntimeKey.objects.filter(pk=runtime.key.pk).update(last_used_at=old)
    runtime.get("/api/v1/audit/events")
    key = RuntimeKey.objects.get(pk=runtime.key.pk)
    assert key.last_used_at is not None and key.last_used_at > old


def test_a_deactivated_key_gets_401_and_the_deactivation_is_audited(
    ada: Any, runtime: Runtime
) -> None:
    assert runtime.get("/api/v1/audit/events").status_code == 200
    client = signed_in(ada)

    response = client.post(f"/manage/keys/{runtime.key.pk}/deactivate")

    assert response.status_code == 302
    assert runtime.get("/api/v1/audit/events").status_code == 401
    assert runtime.propose().status_code == 401
    event = AuditEvent.objects.get(kind="runtime_key.deactivated")
    assert event.actor == "ada" and event.data["name"] == runtime.key.name
    assert "Deactivated runtime key" in client.get(response["Location"]).content.decode()
    # Twice: nothing more is recorded.
    client.post(f"/manage/keys/{runtime.key.pk}/deactivate")
    assert AuditEvent.objects.filter(kind="runtime_key.deactivated").count() == 1


def test_another_tenants_key_cannot_be_seen_or_deactivated(
    gil: Any, runtime: Runtime, other_runtime: Runtime
) -> None:
    client = signed_in(gil)
    page = parse(client.get("/manage/keys/"))
    assert {t.attrs["data-key-id"] for t in page.find_all("tr") if "data-key-id" in t.attrs} == {
        str(other_runtime.key.pk)
    }
    assert runtime.key.prefix not in page.source

    response = client.post(f"/manage/keys/{runtime.key.pk}/deactivate")

    assert response.status_code == 404
    assert RuntimeKey.objects.get(pk=runtime.key.pk).is_active


def test_keys_page_queries_do_not_grow_with_keys(
    ada: Any, tenant: Tenant, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(ada)
    make_runtime(tenant, "k0")
    with CaptureQueriesContext(connection) as captured:
        assert client.get("/manage/keys/").status_code == 200
    few = len(captured.captured_queries)
    for n in range(1, 20):
        make_runtime(tenant, f"k{n}")
    with django_assert_max_num_queries(few):
        response = client.get("/manage/keys/")
    # A redirect or an error page would pass the budget: the keys must be on it.
    assert response.status_code == 200
    assert response.content.decode().count('data-key-id="') == 20


# --- adapter credentials ----------------------------------------------------------------------


def test_the_credential_page_never_shows_the_secret(ada: Any, tenant: Tenant) -> None:
    client = signed_in(ada)

    response = client.post(
        "/manage/credentials/", {"tenant": "acme", "adapter": "payments", "secret": SECRET}
    )

    assert response.status_code == 302
    assert credential_for(tenant_id=tenant.pk, adapter="payments") == SECRET
    assert SECRET not in AdapterCredential.objects.get().secret_encrypted
    page = client.get("/manage/credentials/")
    html = page.content.decode()
    assert SECRET not in html
    assert "Saved the new payments credential of Acme" in html
    assert "by <strong>ada</strong>" in html
    passwords = [t for t in parse(page).find_all("input") if t.attrs.get("type") == "password"]
    assert passwords and all(not t.attrs.get("value") for t in passwords)
    event = AuditEvent.objects.get(kind="credentials.refreshed")
    assert event.actor == "ada" and SECRET not in str(event.data)


def test_a_refused_credential_form_does_not_echo_the_secret(ada: Any) -> None:
    response = signed_in(ada).post(
        "/manage/credentials/", {"tenant": "acme", "adapter": "nope", "secret": SECRET}
    )
    assert response.status_code == 422
    assert SECRET not in response.content.decode()
    assert not AdapterCredential.objects.exists()


def test_replacing_a_credential_says_what_the_interrupted_commands_got(
    ada: Any, runtime: Runtime, reviewer: Any
) -> None:
    commands = []
    for n, state in enumerate([Command.State.REJECTED, Command.State.OUTCOME_UNKNOWN]):
        occurrence = issue(runtime, reviewer, **refund(300 + n, f"pay_i{n}"))
        token = runtime.token(occurrence).json()["token"]
        args = refund(300 + n, f"pay_i{n}")
        command = Command.objects.get(
            pk=runtime.claim(token, f"exec-i{n}", arguments=args).json()["command_id"]
        )
        Command.objects.filter(pk=command.pk).update(state=state)
        Interruption.objects.create(
            command=command,
            epoch=command.epoch,
            kind=Interruption.Kind.AUTH_CHALLENGE,
            challenges=['Bearer realm="payments"'],
        )
        commands.append(command)
    client = signed_in(ada)
    assert "2 commands" in client.get("/manage/credentials/").content.decode()

    response = client.post(
        "/manage/credentials/", {"tenant": "acme", "adapter": "payments", "secret": SECRET}
    )

    html = client.get(response["Location"]).content.decode()
    assert "1 interrupted command got a new epoch; 1 waits for reconciliation" in html


def test_another_tenants_credentials_cannot_be_replaced(gil: Any, tenant: Tenant) -> None:
    client = signed_in(gil)
    assert "Acme" not in client.get("/manage/credentials/").content.decode()

    response = client.post(
        "/manage/credentials/", {"tenant": "acme", "adapter": "payments", "secret": SECRET}
    )

    assert response.status_code == 403
    assert not AdapterCredential.objects.exists()


# --- audit events: read-only, the Django admin included ----------------------------------------


@pytest.fixture
def root(tenant: Tenant) -> Client:
    get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)
    client = Client()
    assert client.login(username="root", password=PASSWORD)
    return client


def test_audit_events_are_read_only_in_the_django_admin(
    root: Client, issued: dict[str, str]
) -> None:
    event = AuditEvent.objects.order_by("id").first()
    assert event is not None
    before = AuditEvent.objects.count()
    base = "/admin/approvals/auditevent/"

    listing = root.get(base)
    assert listing.status_code == 200
    assert "delete_selected" not in listing.content.decode()
    assert 'name="action"' not in listing.content.decode()
    assert root.get(f"{base}add/").status_code == 403
    assert root.get(f"{base}{event.pk}/delete/").status_code == 403
    assert root.post(f"{base}{event.pk}/delete/", {"post": "yes"}).status_code == 403
    # The change page only shows the event; posting to it changes nothing.
    assert root.get(f"{base}{event.pk}/change/").status_code == 200
    assert root.post(f"{base}{event.pk}/change/", {"kind": "edited"}).status_code == 403
    root.post(base, {"action": "delete_selected", "_selected_action": [event.pk], "post": "yes"})

    assert AuditEvent.objects.count() == before
    event.refresh_from_db()
    assert event.kind != "edited"
