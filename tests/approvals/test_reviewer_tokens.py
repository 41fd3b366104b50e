"""Issue 8: reviewers' personal access tokens, and deciding through the API.

A token is a reviewer's own, for one tenant, scoped to deciding, stored hashed, revocable
and expiring. ``POST /api/v1/occurrences/{id}/decisions`` holds the page's rules: the
owner must still be a reviewer, may not approve their own request or edit, must send the
current digest, and a quorum counts distinct people. The audit trail names the token.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.access import reviewer_tokens, tokens
from approvals.errors import InputError, ServiceError
from approvals.models import (
    Approval,
    AuditEvent,
    Membership,
    Occurrence,
    ReviewerToken,
    Tenant,
)
from tests.conftest import REFUND_ARGS, Runtime, make_user


def pat_for(user: Any, tenant: Tenant, name: str = "cli") -> str:
    _, raw = reviewer_tokens.reviewer_token_issue(
        user=user, tenant=tenant, name=name, lifetime_days=30
    )
    return raw


def decide(raw: str, occurrence_id: str, body: dict[str, Any]) -> Any:
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        f"/api/v1/occurrences/{occurrence_id}/decisions",
        json.dumps(body),
        content_type="application/json",
    )


def digest_of(occurrence_id: str) -> str:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    digest: str = occurrence.proposals.get(is_current=True).action_digest
    return digest


@pytest.fixture
def pending(runtime: Runtime) -> str:
    response = runtime.propose()
    assert response.status_code == 201, response.content
    occurrence_id: str = response.json()["occurrence_id"]
    return occurrence_id


# --- the token ------------------------------------------------------------------------------


def test_a_token_is_stored_only_as_its_hash(reviewer: Any, tenant: Tenant) -> None:
    token, raw = reviewer_tokens.reviewer_token_issue(
        user=reviewer, tenant=tenant, name="cli", lifetime_days=7
    )

    assert raw.startswith("pat_") and len(raw) > 40
    assert token.token_hash == tokens.hash_secret(raw)
    assert raw not in {str(v) for v in ReviewerToken.objects.values().get().values()}
    assert token.expires_at - timezone.now() > timedelta(days=6, hours=23)
    event = AuditEvent.objects.get(kind="reviewer_token.created")
    assert event.actor == "rita" and raw not in json.dumps(event.data)


def test_only_a_reviewer_of_the_tenant_may_create_one(operator: Any, tenant: Tenant) -> None:
    with pytest.raises(ServiceError) as refused:
        reviewer_tokens.reviewer_token_issue(
            user=operator, tenant=tenant, name="cli", lifetime_days=7
        )
    assert refused.value.code == "forbidden"
    assert not ReviewerToken.objects.exists()


@pytest.mark.parametrize(
    ("name", "days", "code"),
    [("", 7, "name_required"), ("x" * 101, 7, "too_long"), ("cli", 365, "invalid_lifetime")],
)
def test_bad_token_requests_are_refused(
    reviewer: Any, tenant: Tenant, name: str, days: int, code: str
) -> None:
    with pytest.raises(InputError) as refused:
        reviewer_tokens.reviewer_token_issue(
            user=reviewer, tenant=tenant, name=name, lifetime_days=days
        )
    assert refused.value.code == code
    assert not ReviewerToken.objects.exists()


def test_a_name_is_unique_per_reviewer_and_tenant(reviewer: Any, tenant: Tenant) -> None:
    pat_for(reviewer, tenant, "cli")
    with pytest.raises(InputError) as refused:
        pat_for(reviewer, tenant, "cli")
    assert refused.value.code == "name_taken"
    assert ReviewerToken.objects.count() == 1


# --- deciding -------------------------------------------------------------------------------


def test_a_reviewer_approves_with_the_digest_seen(
    reviewer: Any, tenant: Tenant, runtime: Runtime, pending: str
) -> None:
    raw = pat_for(reviewer, tenant)

    response = decide(raw, pending, {"decision": "approve", "seen_digest": digest_of(pending)})

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["outcome"], body["votes"], body["needed"]) == ("issued", 1, 1)
    assert body["occurrence"]["status"] == "approved"
    approval = Approval.objects.get(occurrence_id=pending)
    assert approval.approver_id == reviewer.pk
    issued = AuditEvent.objects.get(kind="approval.issued")
    assert issued.actor == "rita"
    assert issued.data["via"].startswith("token:cli (pat_")
    assert raw not in json.dumps(issued.data)
    # The runtime goes on as after a click on the page.
    assert runtime.token(pending).status_code == 200


def test_a_reviewer_reads_the_occurrence_with_the_token(
    reviewer: Any, tenant: Tenant, pending: str
) -> None:
    raw = pat_for(reviewer, tenant)

    response = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get(f"/api/v1/occurrences/{pending}")

    assert response.status_code == 200
    assert response.json()["proposal"]["action_digest"] == digest_of(pending)


def test_a_stale_digest_is_refused(reviewer: Any, tenant: Tenant, pending: str) -> None:
    raw = pat_for(reviewer, tenant)

    response = decide(raw, pending, {"decision": "approve", "seen_digest": "0" * 64})

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale_digest"
    assert not Approval.objects.exists()


def test_the_person_the_agent_acts_for_cannot_approve(tenant: Tenant, runtime: Runtime) -> None:
    rita = make_user("rita", tenant, Membership.Role.REVIEWER)
    occurrence_id = runtime.propose(requested_by="rita").json()["occurrence_id"]

    response = decide(
        pat_for(rita, tenant),
        occurrence_id,
        {"decision": "approve", "seen_digest": digest_of(occurrence_id)},
    )

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "self_approval"
    assert not Approval.objects.exists()


def test_a_quorum_counts_distinct_reviewers(
    reviewer: Any, second_reviewer: Any, tenant: Tenant, runtime: Runtime
) -> None:
    big = {**REFUND_ARGS, "amount_minor": 10_000_000}
    occurrence_id = runtime.propose(arguments=big).json()["occurrence_id"]
    body = {"decision": "approve", "seen_digest": digest_of(occurrence_id)}
    first_token = pat_for(reviewer, tenant, "one")

    first = decide(first_token, occurrence_id, body)
    again = decide(pat_for(reviewer, tenant, "two"), occurrence_id, body)
    second = decide(pat_for(second_reviewer, tenant), occurrence_id, body)

    assert (first.json()["outcome"], first.json()["votes"], first.json()["needed"]) == (
        "vote_recorded",
        1,
        2,
    )
    # The same person with another token is still one vote.
    assert (again.json()["outcome"], again.json()["votes"]) == ("vote_recorded", 1)
    assert (second.json()["outcome"], second.json()["votes"]) == ("issued", 2)
    assert Approval.objects.filter(occurrence_id=occurrence_id).count() == 1


def test_a_rejection_needs_a_reason_and_reaches_the_runtime(
    reviewer: Any, tenant: Tenant, runtime: Runtime, pending: str
) -> None:
    raw = pat_for(reviewer, tenant)

    missing = decide(raw, pending, {"decision": "reject"})
    rejected = decide(raw, pending, {"decision": "reject", "reason": "Duplicate of #41"})

    assert missing.status_code == 422
    assert missing.json()["error"]["code"] == "reason_required"
    assert rejected.status_code == 200 and rejected.json()["outcome"] == "rejected"
    pickup = runtime.token(pending)
    assert pickup.status_code == 409
    assert pickup.json()["error"]["details"]["reason"] == "Duplicate of #41"
    event = AuditEvent.objects.get(kind="occurrence.rejected")
    assert event.data["via"].startswith("token:cli")


def test_a_decided_request_is_409(reviewer: Any, tenant: Tenant, pending: str) -> None:
    raw = pat_for(reviewer, tenant)
    decide(raw, pending, {"decision": "reject", "reason": "no"})

    again = decide(raw, pending, {"decision": "approve", "seen_digest": digest_of(pending)})

    assert again.status_code == 409
    assert not Approval.objects.exists()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"decision": "approve"}, "missing_field"),
        ({"decision": "maybe"}, None),
        ({"decision": "approve", "seen_digest": "xyz"}, None),
        ({"decision": "approve", "seen_digest": "0" * 64, "extra": 1}, None),
    ],
)
def test_bad_bodies_are_422_and_change_nothing(
    reviewer: Any, tenant: Tenant, pending: str, body: dict[str, Any], code: str | None
) -> None:
    response = decide(pat_for(reviewer, tenant), pending, body)

    assert response.status_code == 422, response.content
    if code:
        assert response.json()["error"]["code"] == code
    assert Occurrence.objects.get(pk=pending).status == "pending_review"
    assert not AuditEvent.objects.filter(kind__startswith="approval.").exists()


# --- who may use a token ----------------------------------------------------------------------


def test_a_runtime_key_cannot_decide(runtime: Runtime, pending: str) -> None:
    response = decide(runtime.raw_key, pending, {"decision": "reject", "reason": "self-serve"})

    assert response.status_code == 401
    assert Occurrence.objects.get(pk=pending).status == "pending_review"


def test_a_token_cannot_act_as_a_runtime(reviewer: Any, tenant: Tenant, pending: str) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {pat_for(reviewer, tenant)}")

    assert client.post(f"/api/v1/occurrences/{pending}/token").status_code == 401
    assert client.get("/api/v1/tools").status_code == 401


def test_another_tenants_request_is_404(
    reviewer: Any, tenant: Tenant, other_runtime: Runtime
) -> None:
    theirs = other_runtime.propose().json()["occurrence_id"]

    response = decide(
        pat_for(reviewer, tenant), theirs, {"decision": "approve", "seen_digest": digest_of(theirs)}
    )

    assert response.status_code == 404
    assert not Approval.objects.exists()


def test_a_revoked_token_is_refused_at_once(reviewer: Any, tenant: Tenant, pending: str) -> None:
    raw = pat_for(reviewer, tenant)
    token = ReviewerToken.objects.get()

    assert reviewer_tokens.reviewer_token_revoke(token=token, user=reviewer)
    response = decide(raw, pending, {"decision": "reject", "reason": "no"})

    assert response.status_code == 401
    assert AuditEvent.objects.filter(kind="reviewer_token.revoked").count() == 1
    assert not reviewer_tokens.reviewer_token_revoke(token=token, user=reviewer)  # already


def test_an_expired_token_is_refused(reviewer: Any, tenant: Tenant, pending: str) -> None:
    raw = pat_for(reviewer, tenant)
    ReviewerToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    assert decide(raw, pending, {"decision": "reject", "reason": "no"}).status_code == 401


def test_a_reviewer_who_lost_the_role_is_refused(
    reviewer: Any, tenant: Tenant, pending: str
) -> None:
    raw = pat_for(reviewer, tenant)
    Membership.objects.filter(user=reviewer).delete()

    response = decide(raw, pending, {"decision": "approve", "seen_digest": digest_of(pending)})

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


def test_a_deactivated_user_is_refused(reviewer: Any, tenant: Tenant, pending: str) -> None:
    raw = pat_for(reviewer, tenant)
    type(reviewer).objects.filter(pk=reviewer.pk).update(is_active=False)

    assert decide(raw, pending, {"decision": "reject", "reason": "no"}).status_code == 401


def test_only_the_owner_or_a_tenant_admin_may_revoke(
    reviewer: Any, second_reviewer: Any, admin_user: Any, tenant: Tenant
) -> None:
    pat_for(reviewer, tenant)
    token = ReviewerToken.objects.get()

    with pytest.raises(ServiceError):
        reviewer_tokens.reviewer_token_revoke(token=token, user=second_reviewer)
    assert reviewer_tokens.reviewer_token_revoke(token=token, user=admin_user)
    assert AuditEvent.objects.get(kind="reviewer_token.revoked").data["owner"] == "rita"


def test_a_superuser_revokes_in_the_django_admin(reviewer: Any, tenant: Tenant) -> None:
    from django.contrib.auth import get_user_model

    raw = pat_for(reviewer, tenant)
    token = ReviewerToken.objects.get()
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-123")
    client = Client()
    client.force_login(root)

    listing = client.get("/admin/approvals/reviewertoken/")
    response = client.post(
        "/admin/approvals/reviewertoken/",
        {"action": "revoke", "_selected_action": [str(token.pk)]},
        follow=True,
    )

    assert listing.status_code == 200 and raw not in listing.content.decode()
    assert token.token_hash not in listing.content.decode()
    assert "Revoked 1 token(s)." in response.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.get(kind="reviewer_token.revoked").actor == "root"
