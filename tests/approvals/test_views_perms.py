"""Who may see and do what in the console: the exact status of every page and action for
every role, in the user's own tenant and in another one; CSRF and method rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from approvals.models import Approval, Membership, Occurrence, Tenant
from approvals.reviews.proposals import occurrence_propose
from tests.approvals.test_views_html import parse, propose, signed_in
from tests.conftest import REFUND_ARGS, Runtime, approve, make_user

ACTIONS = ["approve", "reject", "edit", "revoke"]


def _body(action: str, occurrence_id: str) -> dict[str, str]:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    digest = occurrence.proposals.get(is_current=True).action_digest
    if action == "approve":
        return {"action_digest": digest}
    if action == "edit":
        arguments = dict(REFUND_ARGS, amount_minor=7000)
        return {"arguments": json.dumps(arguments), "action_digest": digest}
    return {"reason": "Not this one."}


@pytest.fixture
def people(tenant: Tenant, other_tenant: Tenant) -> dict[str, Any]:
    return {
        "reviewer": make_user("rev", tenant, Membership.Role.REVIEWER),
        "operator": make_user("ops", tenant, Membership.Role.OPERATOR),
        "admin": make_user("adm", tenant, Membership.Role.ADMIN),
        "none": make_user("nobody", other_tenant, Membership.Role.OPERATOR),
    }


@pytest.fixture
def occurrences(runtime: Runtime, other_runtime: Runtime, second_reviewer: Any) -> dict[str, Any]:
    """Per tenant: a pending occurrence and one with an issued approval."""
    result: dict[str, Any] = {}
    for name, rt, approver in (("own", runtime, second_reviewer), ("other", other_runtime, None)):
        pending = propose(rt)
        issued = propose(rt, arguments=dict(REFUND_ARGS, payment_id="pay_issued"))
        if approver is None:
            approver = make_user(f"approver-{name}", rt.key.tenant, Membership.Role.REVIEWER)
        assert approve(issued, approver).issued
        result[name] = {"pending": pending, "issued": issued}
    return result


# role -> (inbox, review, panel, approve, reject, edit, revoke) in the user's own tenant
OWN_TENANT = {
    "reviewer": (200, 200, 200, 302, 302, 302, 403),
    "operator": (200, 404, 404, 404, 404, 404, 404),
    "admin": (200, 200, 200, 403, 403, 403, 302),
    "none": (200, 404, 404, 404, 404, 404, 404),
}


@pytest.mark.parametrize("role", list(OWN_TENANT))
@pytest.mark.parametrize("tenant_name", ["own", "other"])
def test_permission_matrix(
    role: str, tenant_name: str, people: dict[str, Any], occurrences: dict[str, Any]
) -> None:
    client = signed_in(people[role])
    ids = occurrences[tenant_name]
    expected = OWN_TENANT[role] if tenant_name == "own" else (200, 404, 404, 404, 404, 404, 404)

    statuses = [
        client.get("/reviews/?state=all").status_code,
        client.get(f"/reviews/{ids['pending']}/").status_code,
        client.get(f"/reviews/{ids['pending']}/panel").status_code,
    ]
    for action in ACTIONS:
        target = ids["issued"] if action == "revoke" else ids["pending"]
        response = client.post(f"/reviews/{target}/{action}", _body(action, target))
        statuses.append(response.status_code)
        if action in {"approve", "reject"}:
            # reject needs a still pending occurrence; approve moved it on.
            ids["pending"] = propose_again(ids, tenant_name)
    assert tuple(statuses) == expected


def propose_again(ids: dict[str, Any], tenant_name: str) -> str:
    """A fresh pending occurrence in the same tenant, made without the API client."""

    occurrence = Occurrence.objects.get(pk=ids["pending"])
    fresh, _ = occurrence_propose(
        runtime_key=occurrence.runtime_key,  # type: ignore[arg-type]
        tool="issue_refund",
        arguments=dict(REFUND_ARGS),
        run_id="run-again",
        reason="again",
    )
    return str(fresh.pk)


def test_inbox_lists_only_the_tenants_a_person_reviews(
    people: dict[str, Any], occurrences: dict[str, Any]
) -> None:
    own = {str(v) for v in occurrences["own"].values()}
    other = {str(v) for v in occurrences["other"].values()}
    for role, sees in (("reviewer", own), ("admin", own), ("operator", set()), ("none", set())):
        page = parse(signed_in(people[role]).get("/reviews/?state=all"))
        rows = {
            str(t.attrs["data-occurrence-id"])
            for t in page.find_all("tr")
            if "data-occurrence-id" in t.attrs
        }
        assert rows == sees, role
        assert not rows & other


def test_decisions_leave_other_tenants_untouched(
    people: dict[str, Any], occurrences: dict[str, Any]
) -> None:
    client = signed_in(people["reviewer"])
    pending = occurrences["other"]["pending"]
    client.post(f"/reviews/{pending}/approve", _body("approve", pending))
    client.post(f"/reviews/{pending}/reject", {"reason": "no"})
    occurrence = Occurrence.objects.get(pk=pending)
    assert occurrence.status == Occurrence.Status.PENDING_REVIEW
    assert not occurrence.proposals.get(is_current=True).votes.exists()


def test_admin_only_sees_the_revoke_form_not_the_decision_forms(
    people: dict[str, Any], occurrences: dict[str, Any]
) -> None:
    client = signed_in(people["admin"])
    pending = parse(client.get(f"/reviews/{occurrences['own']['pending']}/"))
    assert not pending.has("approve-form") and not pending.has("reject-form")
    assert not pending.has("edit-form")
    issued = parse(client.get(f"/reviews/{occurrences['own']['issued']}/"))
    assert issued.has("revoke-form")
    reviewer_view = parse(
        signed_in(people["reviewer"]).get(f"/reviews/{occurrences['own']['issued']}/")
    )
    assert not reviewer_view.has("revoke-form")


@pytest.mark.parametrize("url", ["/reviews/", "/reviews/{id}/", "/reviews/{id}/panel"])
def test_anonymous_pages_redirect_to_sign_in(url: str, occurrences: dict[str, Any]) -> None:
    path = url.format(id=occurrences["own"]["pending"])
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.parametrize("action", ACTIONS)
def test_anonymous_actions_redirect_to_sign_in_and_change_nothing(
    action: str, occurrences: dict[str, Any]
) -> None:
    target = occurrences["own"]["issued" if action == "revoke" else "pending"]
    response = Client().post(f"/reviews/{target}/{action}", _body(action, target))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert Occurrence.objects.get(pk=occurrences["own"]["pending"]).status == "pending_review"
    assert Approval.objects.get(occurrence_id=occurrences["own"]["issued"]).state == "issued"


def test_anonymous_htmx_request_is_sent_to_sign_in_as_a_whole_page(
    occurrences: dict[str, Any],
) -> None:
    pending = occurrences["own"]["pending"]
    response = Client().get(
        f"/reviews/{pending}/panel",
        headers={"HX-Request": "true", "HX-Current-URL": f"http://testserver/reviews/{pending}/"},
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"/accounts/login/?next=%2Freviews%2F{pending}%2F"


@pytest.mark.parametrize("action", [*ACTIONS])
def test_get_on_an_action_url_is_405(
    action: str, reviewer: Any, occurrences: dict[str, Any]
) -> None:
    pending = occurrences["own"]["pending"]
    response = signed_in(reviewer).get(f"/reviews/{pending}/{action}")
    assert response.status_code == 405
    assert Occurrence.objects.get(pk=pending).status == "pending_review"


def test_get_on_tenant_switch_is_405(reviewer: Any) -> None:
    assert signed_in(reviewer).get("/tenant/").status_code == 405


def test_unknown_or_malformed_occurrence_ids_are_404(reviewer: Any) -> None:
    client = signed_in(reviewer)
    assert client.get("/reviews/00000000-0000-0000-0000-000000000000/").status_code == 404
    assert client.get("/reviews/not-a-uuid/").status_code == 404


@pytest.mark.parametrize("action", ACTIONS)
def test_posts_without_csrf_token_are_refused(
    action: str, people: dict[str, Any], occurrences: dict[str, Any]
) -> None:
    user = people["admin" if action == "revoke" else "reviewer"]
    client = signed_in(user, enforce_csrf_checks=True)
    target = occurrences["own"]["issued" if action == "revoke" else "pending"]
    response = client.post(f"/reviews/{target}/{action}", _body(action, target))
    assert response.status_code == 403
    assert Occurrence.objects.get(pk=occurrences["own"]["pending"]).status == "pending_review"
    assert Approval.objects.get(occurrence_id=occurrences["own"]["issued"]).state == "issued"


def test_post_with_the_pages_csrf_token_is_accepted(
    people: dict[str, Any], occurrences: dict[str, Any]
) -> None:
    client = signed_in(people["reviewer"], enforce_csrf_checks=True)
    pending = occurrences["own"]["pending"]
    page = parse(client.get(f"/reviews/{pending}/"))
    token = next(
        t.attrs["value"]
        for t in page.find_all("input")
        if t.attrs.get("name") == "csrfmiddlewaretoken"
    )
    body = {**_body("approve", pending), "csrfmiddlewaretoken": str(token)}
    response = client.post(f"/reviews/{pending}/approve", body)
    assert response.status_code == 302


def test_htmx_posts_carry_the_csrf_token_in_a_header(
    people: dict[str, Any], occurrences: dict[str, Any]
) -> None:
    client = signed_in(people["reviewer"], enforce_csrf_checks=True)
    pending = occurrences["own"]["pending"]
    page = parse(client.get(f"/reviews/{pending}/"))
    body_tag = page.find_all("body")[0]
    token = json.loads(str(body_tag.attrs["hx-headers"]))["x-csrftoken"]
    response = client.post(
        f"/reviews/{pending}/approve",
        _body("approve", pending),
        headers={"HX-Request": "true", "X-CSRFToken": token},
    )
    assert response.status_code == 200
    assert parse(response).attr("decision-panel", "data-state") == "issued"
