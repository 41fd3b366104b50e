"""Issue 9, finding 4: a token belongs to the runtime key that proposed its request.

Before, any runtime key of a tenant could pick up and claim another key's request, every
audit event of a runtime step said only ``runtime``, and the pickup answer (the one answer
that carries a raw token) had no ``Cache-Control``. Now another key gets ``403
other_runtime_key`` at pickup and ``scope_mismatch``/``other_runtime_key`` at claim, unless
an admin put both keys in one runtime group; every runtime event names its key; and every
API answer is ``no-store``.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals.models import Approval, AuditEvent, Command, RuntimeKey, Tenant
from tests.conftest import PASSWORD, Runtime, approve, make_runtime


@pytest.fixture
def sibling(tenant: Tenant) -> Runtime:
    """A second runtime key of the same tenant."""
    return make_runtime(tenant, "sibling-agent")


def group(*runtimes: Runtime, name: str) -> None:
    """An admin's grant: the keys become one runtime."""
    for runtime in runtimes:
        RuntimeKey.objects.filter(pk=runtime.key.pk).update(runtime_group=name)
        runtime.key.refresh_from_db()


def body_of(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    return body


# --- pickup ---------------------------------------------------------------------------------


def test_another_key_of_the_tenant_cannot_pick_up_the_token(
    runtime: Runtime, sibling: Runtime, approved: str
) -> None:
    refused = sibling.token(approved)

    assert refused.status_code == 403
    assert body_of(refused)["error"]["code"] == "other_runtime_key"
    assert "token" not in body_of(refused)
    # Nothing was minted or recorded: the proposing key still gets the token, once.
    approval = Approval.objects.get(occurrence_id=approved)
    assert approval.token_hash is None and approval.delivered_at is None
    assert not AuditEvent.objects.filter(kind="token.delivered").exists()
    picked = runtime.token(approved)
    assert picked.status_code == 200
    assert body_of(picked)["token"].startswith("apv_")


def test_another_key_is_refused_whatever_the_state_so_it_learns_nothing_more(
    runtime: Runtime, sibling: Runtime
) -> None:
    pending = body_of(runtime.propose())["occurrence_id"]

    refused = sibling.token(pending)

    assert refused.status_code == 403
    assert body_of(refused)["error"]["code"] == "other_runtime_key"


def test_a_key_of_the_same_runtime_group_may_pick_up_and_claim(
    runtime: Runtime, sibling: Runtime, approved: str
) -> None:
    group(runtime, sibling, name="support-fleet")

    picked = sibling.token(approved)
    assert picked.status_code == 200
    claimed = sibling.claim(body_of(picked)["token"], "exec-sibling")

    assert claimed.status_code == 200
    assert body_of(claimed)["decision"] == "approved"
    command = Command.objects.get()
    assert command.execution_id == "exec-sibling"


def test_a_key_of_another_runtime_group_is_refused(
    tenant: Tenant, runtime: Runtime, sibling: Runtime, approved: str
) -> None:
    group(runtime, name="support-fleet")
    group(sibling, name="billing-fleet")

    assert sibling.token(approved).status_code == 403


def test_an_empty_group_grants_nothing(runtime: Runtime, sibling: Runtime, approved: str) -> None:
    # Two keys without a group are not "the same group".
    assert runtime.key.runtime_group == sibling.key.runtime_group == ""

    assert sibling.token(approved).status_code == 403


def test_another_tenants_key_still_gets_404(other_runtime: Runtime, approved: str) -> None:
    response = other_runtime.token(approved)

    assert response.status_code == 404
    assert body_of(response)["error"]["code"] == "not_found"


# --- claim ----------------------------------------------------------------------------------


def test_another_key_cannot_claim_a_token_it_got_hold_of(
    runtime: Runtime, sibling: Runtime, token: str, approved: str
) -> None:
    refused = sibling.claim(token, "exec-sibling")

    assert refused.status_code == 403
    body = body_of(refused)
    assert (body["decision"], body["reason"]) == ("scope_mismatch", "other_runtime_key")
    # The approval is untouched: the key that proposed still claims it.
    approval = Approval.objects.get(occurrence_id=approved)
    assert approval.state == Approval.State.ISSUED
    assert not Command.objects.exists()
    event = AuditEvent.objects.get(kind="claim.scope_mismatch")
    assert event.actor == "runtime:sibling-agent"
    assert event.reason_code == "other_runtime_key"
    assert event.execution_id == "exec-sibling"
    assert event.token_fingerprint == approval.fingerprint
    assert str(event.occurrence_id) == approved

    claimed = runtime.claim(token, "exec-a")
    assert claimed.status_code == 200
    assert body_of(claimed)["decision"] == "approved"


def test_another_key_replaying_a_consumed_token_is_refused_and_recorded(
    runtime: Runtime, sibling: Runtime, token: str
) -> None:
    assert runtime.claim(token, "exec-a").status_code == 200

    refused = sibling.claim(token, "exec-b")

    body = body_of(refused)
    assert (body["decision"], body["reason"]) == ("scope_mismatch", "other_runtime_key")
    assert Command.objects.count() == 1
    assert AuditEvent.objects.filter(
        kind="claim.scope_mismatch", actor="runtime:sibling-agent", execution_id="exec-b"
    ).exists()


def test_a_single_key_runtime_keeps_the_v1_answers(runtime: Runtime, token: str) -> None:
    assert body_of(runtime.claim(token, "exec-a"))["decision"] == "approved"
    assert body_of(runtime.claim(token, "exec-a"))["decision"] == "duplicate_delivery"
    replayed = body_of(runtime.claim(token, "exec-b"))
    assert (replayed["decision"], replayed["reason"]) == ("replayed", "consumed_by_other_execution")


def test_another_key_may_still_read_the_occurrence(
    runtime: Runtime, sibling: Runtime, approved: str
) -> None:
    # The detail holds no secret (never the token), and the tenant's keys may watch each
    # other's requests; only the capability is bound to the key.
    response = sibling.get(f"/api/v1/occurrences/{approved}")

    assert response.status_code == 200
    assert body_of(response)["approval"]["token_delivered"] is False


# --- actors ---------------------------------------------------------------------------------


def test_every_runtime_event_names_its_key(runtime: Runtime, reviewer: Any) -> None:
    occurrence_id = body_of(runtime.propose())["occurrence_id"]
    approve(occurrence_id, reviewer)
    token = body_of(runtime.token(occurrence_id))["token"]
    runtime.claim(token, "exec-a")
    runtime.claim(token, "exec-a")
    runtime.claim(token, "exec-b")
    runtime.claim("apv_" + "x" * 43, "exec-c")

    actors = dict(AuditEvent.objects.filter(kind__in=RUNTIME_KINDS).values_list("kind", "actor"))

    assert actors == {kind: "runtime:agent" for kind in RUNTIME_KINDS}
    assert not AuditEvent.objects.filter(actor="runtime").exists()


RUNTIME_KINDS = [
    "occurrence.proposed",
    "token.delivered",
    "claim.approved",
    "claim.duplicate_delivery",
    "claim.replayed",
    "claim.unknown_token",
]


# --- caches ---------------------------------------------------------------------------------


def no_store(response: Any) -> bool:
    return "no-store" in response.get("Cache-Control", "")


def test_the_token_pickup_answer_is_no_store(runtime: Runtime, approved: str) -> None:
    picked = runtime.token(approved)

    assert picked.status_code == 200
    assert no_store(picked)
    assert "private" in picked["Cache-Control"]


def test_every_api_answer_is_no_store(
    runtime: Runtime, sibling: Runtime, approved: str, client: Any
) -> None:
    answers = [
        runtime.get(f"/api/v1/occurrences/{approved}"),
        runtime.token(approved),
        runtime.token(approved),  # 409 token_already_delivered
        sibling.token(approved),  # 403 other_runtime_key
        runtime.claim("apv_unknown", "exec-a"),  # 403 refusal
        runtime.propose(arguments={"nope": 1}),  # 422
        client.get("/api/v1/occurrences"),  # 401 without a key
        runtime.get("/api/v1/audit/events"),  # NDJSON stream
    ]

    assert [a.status_code for a in answers] == [200, 200, 409, 403, 403, 422, 401, 200]
    assert all(no_store(a) for a in answers), [
        (a.status_code, a.get("Cache-Control")) for a in answers
    ]


def test_an_admin_puts_keys_in_one_runtime_group_in_the_django_admin(
    runtime: Runtime, tenant: Tenant
) -> None:
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)
    client = Client()
    client.login(username="root", password=PASSWORD)
    url = f"/admin/approvals/runtimekey/{runtime.key.pk}/change/"

    response = client.post(
        url, {"name": runtime.key.name, "runtime_group": "support-bots", "is_active": "on"}
    )

    assert response.status_code == 302, response.content.decode()[-2000:]
    runtime.key.refresh_from_db()
    assert runtime.key.runtime_group == "support-bots"
