"""One approval, many OS processes released together: at most one command, ever.

Each test keeps a pool of worker processes (forked, one database connection each) alive
across rounds; every round they wait on one barrier and then call the service at once.
A process-local lock would prove nothing here, which is the point of using processes.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from approvals.claims.claim import approval_claim
from approvals.claims.delivery import approval_deliver_token
from approvals.errors import ServiceError
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Command,
    Epoch,
    Membership,
    Occurrence,
    Tenant,
)
from approvals.reviews.decisions import occurrence_approve, proposal_edit
from approvals.reviews.proposals import occurrence_propose
from approvals.reviews.revocation import approval_revoke
from tests.conftest import REFUND_ARGS, Runtime, make_user
from tests.races import RACE, Pool

pytestmark = [*RACE, pytest.mark.slow]

PROCS = 8
ROUNDS = 50
HTTP_ROUNDS = 5
APPROVE_ROUNDS = 15

EDITED_ARGS: dict[str, Any] = {**REFUND_ARGS, "amount_minor": 100}
MESSAGE_ARGS: dict[str, Any] = {"to": "ana@example.com", "subject": "Hello", "body": "Your parcel."}


# --- what the workers run (module level, so the jobs can be pickled by name) -------------


def claim_job(
    tenant_id: int, token: str, execution_id: str, jitter_ms: float = 0
) -> tuple[str, str, str | None]:
    # Jitter lets a slower racer (an edit, a revocation) come first in some rounds.
    time.sleep(random.uniform(0, jitter_ms) / 1000)
    result = approval_claim(
        tenant=Tenant.objects.get(pk=tenant_id),
        token=token,
        tool="issue_refund",
        arguments=dict(REFUND_ARGS),
        execution_id=execution_id,
        message_id=f"msg-{execution_id}",
    )
    return result.decision, result.reason, str(result.command.id) if result.command else None


def http_claim_job(raw_key: str, token: str, execution_id: str) -> tuple[int, str, str | None]:
    body = {
        "token": token,
        "action": {"tool": "issue_refund", "arguments": dict(REFUND_ARGS)},
        "execution_id": execution_id,
    }
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    response = client.post("/api/v1/claims", json.dumps(body), content_type="application/json")
    body = response.json()
    return response.status_code, body["decision"], body.get("command_id")


def approve_job(occurrence_id: str, reviewer_id: int, seen_digest: str) -> str:
    occurrence = Occurrence.objects.get(pk=occurrence_id)
    reviewer = get_user_model().objects.get(pk=reviewer_id)
    try:
        outcome = occurrence_approve(
            occurrence=occurrence, reviewer=reviewer, seen_digest=seen_digest
        )
    except ServiceError as exc:
        return exc.code
    return "issued" if outcome.issued else f"vote {outcome.votes}/{outcome.needed}"


def edit_job(occurrence_id: str, editor_id: int, seen_digest: str) -> str:
    try:
        proposal_edit(
            occurrence=Occurrence.objects.get(pk=occurrence_id),
            editor=get_user_model().objects.get(pk=editor_id),
            arguments=EDITED_ARGS,
            seen_digest=seen_digest,
        )
    except ServiceError as exc:
        return exc.code
    return "edited"


def revoke_job(approval_id: int, admin_id: int) -> str:
    revoked = approval_revoke(
        approval=Approval.objects.get(pk=approval_id),
        admin=get_user_model().objects.get(pk=admin_id),
        reason="race",
    )
    return "revoked" if revoked else "not_revocable"


def redeliver_job(occurrence_id: str, execution_id: str) -> tuple[str, str]:
    """A pickup by the bound execution: ("token", raw) or ("refused", code)."""
    try:
        delivered = approval_deliver_token(
            occurrence=Occurrence.objects.get(pk=occurrence_id), execution_id=execution_id
        )
    except ServiceError as exc:
        return "refused", exc.code
    return "token", delivered.token


@pytest.fixture
def pool(transactional_db: Any) -> Iterator[Pool]:
    workers = Pool(PROCS)
    try:
        yield workers
    finally:
        workers.close()


# --- helpers ----------------------------------------------------------------------------


def _approved_token(runtime: Runtime, reviewer: Any, arguments: dict[str, Any]) -> tuple[str, str]:
    """A fresh approved refund and its picked-up token: (occurrence id, raw token)."""
    occurrence, _ = occurrence_propose(
        runtime_key=runtime.key,
        tool="issue_refund",
        arguments=arguments,
        run_id="run-race",
        reason="race",
    )
    digest = occurrence.proposals.get(is_current=True).action_digest
    outcome = occurrence_approve(occurrence=occurrence, reviewer=reviewer, seen_digest=digest)
    assert outcome.issued
    return str(occurrence.pk), approval_deliver_token(occurrence=occurrence).token


def _assert_one_command(occurrence_id: str, winner_execution: str) -> Command:
    approval = Approval.objects.get(occurrence_id=occurrence_id)
    assert approval.state == Approval.State.CONSUMED
    assert approval.consumed_by_execution == winner_execution
    commands = list(Command.objects.filter(occurrence_id=occurrence_id))
    assert len(commands) == 1
    assert commands[0].approval_id == approval.pk
    assert commands[0].execution_id == winner_execution
    epochs = list(Epoch.objects.filter(occurrence_id=occurrence_id))
    assert [(e.number, e.execution_id) for e in epochs] == [(1, winner_execution)]
    assert commands[0].epoch_id == epochs[0].pk
    return commands[0]


def _claim_decisions(occurrence_id: str) -> Counter[str]:
    return Counter(
        AuditEvent.objects.filter(
            occurrence_id=occurrence_id, kind__startswith="claim."
        ).values_list("decision", flat=True)
    )


# --- the claim --------------------------------------------------------------------------


def test_distinct_executions_racing_one_approval_get_one_command(
    pool: Pool, tenant: Tenant, reviewer: Any, runtime: Runtime
) -> None:
    for round_no in range(ROUNDS):
        occurrence_id, token = _approved_token(runtime, reviewer, dict(REFUND_ARGS))
        executions = [f"exec-{round_no}-{i}-{uuid.uuid4().hex[:6]}" for i in range(PROCS)]
        results = pool.run(
            [
                (claim_job, {"tenant_id": tenant.pk, "token": token, "execution_id": e})
                for e in executions
            ]
        )

        assert Counter(r[0] for r in results) == {"approved": 1, "replayed": PROCS - 1}, results
        (winner,) = [e for e, r in zip(executions, results, strict=True) if r[0] == "approved"]
        command = _assert_one_command(occurrence_id, winner)
        assert {r[2] for r in results} == {str(command.id), None}
        assert {r[1] for r in results if r[0] == "replayed"} == {"consumed_by_other_execution"}
        assert _claim_decisions(occurrence_id) == {"approved": 1, "replayed": PROCS - 1}


def test_one_execution_delivered_many_times_gets_one_command(
    pool: Pool, tenant: Tenant, reviewer: Any, runtime: Runtime
) -> None:
    for round_no in range(ROUNDS):
        occurrence_id, token = _approved_token(runtime, reviewer, dict(REFUND_ARGS))
        execution = f"exec-shared-{round_no}"
        results = pool.run(
            [(claim_job, {"tenant_id": tenant.pk, "token": token, "execution_id": execution})]
            * PROCS
        )

        assert Counter(r[0] for r in results) == {
            "approved": 1,
            "duplicate_delivery": PROCS - 1,
        }, results
        command = _assert_one_command(occurrence_id, execution)
        # Every delivery resolves to the same command, so the adapter sees one key.
        assert {r[2] for r in results} == {str(command.id)}
        assert _claim_decisions(occurrence_id) == {"approved": 1, "duplicate_delivery": PROCS - 1}


def test_racing_http_claims_get_one_command(
    pool: Pool, tenant: Tenant, reviewer: Any, runtime: Runtime
) -> None:
    for round_no in range(HTTP_ROUNDS):
        occurrence_id, token = _approved_token(runtime, reviewer, dict(REFUND_ARGS))
        executions = [f"http-{round_no}-{i}" for i in range(PROCS)]
        results = pool.run(
            [
                (http_claim_job, {"raw_key": runtime.raw_key, "token": token, "execution_id": e})
                for e in executions
            ]
        )

        assert Counter((r[0], r[1]) for r in results) == {
            (200, "approved"): 1,
            (403, "replayed"): PROCS - 1,
        }, results
        (winner,) = [e for e, r in zip(executions, results, strict=True) if r[1] == "approved"]
        _assert_one_command(occurrence_id, winner)


def test_edit_racing_claims_either_supersedes_the_approval_or_is_refused(
    pool: Pool, tenant: Tenant, reviewer: Any, runtime: Runtime
) -> None:
    editor = make_user("edith", tenant, Membership.Role.REVIEWER)
    seen: Counter[str] = Counter()
    for round_no in range(ROUNDS):
        occurrence_id, token = _approved_token(runtime, reviewer, dict(REFUND_ARGS))
        digest = Occurrence.objects.get(pk=occurrence_id).proposals.get(is_current=True)
        executions = [f"edit-race-{round_no}-{i}" for i in range(PROCS - 1)]
        edit_args = {"occurrence_id": occurrence_id, "editor_id": editor.pk}
        claim_args: dict[str, Any] = {
            "tenant_id": tenant.pk,
            "token": token,
            "jitter_ms": 20 * (round_no % 2),
        }
        results = pool.run(
            [(edit_job, {**edit_args, "seen_digest": digest.action_digest})]
            + [(claim_job, {**claim_args, "execution_id": e}) for e in executions]
        )

        edit, claims = results[0], results[1:]
        seen[edit] += 1
        if edit == "edited":
            # The edit came first: the old approval authorizes nothing any more.
            assert Counter((r[0], r[1]) for r in claims) == {
                ("scope_mismatch", "proposal_superseded"): PROCS - 1
            }, results
            assert not Command.objects.filter(occurrence_id=occurrence_id).exists()
        else:
            # A claim came first: the claimed action can no longer be edited.
            assert edit == "not_editable", results
            assert Counter(r[0] for r in claims) == {"approved": 1, "replayed": PROCS - 2}, results
            (winner,) = [e for e, r in zip(executions, claims, strict=True) if r[0] == "approved"]
            _assert_one_command(occurrence_id, winner)
    print(f"edit against claims: {dict(seen)}")


def test_revoke_racing_claims_either_revokes_or_is_too_late(
    pool: Pool, tenant: Tenant, reviewer: Any, admin_user: Any, runtime: Runtime
) -> None:
    seen: Counter[str] = Counter()
    for round_no in range(ROUNDS):
        occurrence_id, token = _approved_token(runtime, reviewer, dict(REFUND_ARGS))
        approval = Approval.objects.get(occurrence_id=occurrence_id)
        executions = [f"revoke-race-{round_no}-{i}" for i in range(PROCS - 1)]
        claim_args: dict[str, Any] = {
            "tenant_id": tenant.pk,
            "token": token,
            "jitter_ms": 20 * (round_no % 2),
        }
        results = pool.run(
            [(revoke_job, {"approval_id": approval.pk, "admin_id": admin_user.pk})]
            + [(claim_job, {**claim_args, "execution_id": e}) for e in executions]
        )

        revoke, claims = results[0], results[1:]
        seen[revoke] += 1
        if revoke == "revoked":
            assert Counter((r[0], r[1]) for r in claims) == {
                ("revoked", "revoked_by_admin"): PROCS - 1
            }, results
            assert not Command.objects.filter(occurrence_id=occurrence_id).exists()
        else:
            assert revoke == "not_revocable", results
            assert Counter(r[0] for r in claims) == {"approved": 1, "replayed": PROCS - 2}, results
            (winner,) = [e for e, r in zip(executions, claims, strict=True) if r[0] == "approved"]
            _assert_one_command(occurrence_id, winner)
    print(f"revoke against claims: {dict(seen)}")


# --- re-delivery to the bound execution -------------------------------------------------


def _bound_token(runtime: Runtime, reviewer: Any, execution_id: str) -> tuple[str, str]:
    occurrence, _ = occurrence_propose(
        runtime_key=runtime.key,
        tool="issue_refund",
        arguments=dict(REFUND_ARGS),
        run_id="run-race",
        reason="race",
    )
    digest = occurrence.proposals.get(is_current=True).action_digest
    assert occurrence_approve(occurrence=occurrence, reviewer=reviewer, seen_digest=digest).issued
    token = approval_deliver_token(occurrence=occurrence, execution_id=execution_id)
    return str(occurrence.pk), token.token


def test_redeliveries_racing_claims_of_the_old_token_let_exactly_one_side_win(
    pool: Pool, tenant: Tenant, reviewer: Any, runtime: Runtime
) -> None:
    """Either a claim consumed the old token first (and every re-delivery is told
    ``claimed``), or a re-delivery retired it first (and every claim with it is a named
    replay): never a command and a live fresh token for one approval."""
    half = PROCS // 2
    outcomes: Counter[str] = Counter()
    for round_no in range(ROUNDS):
        execution = f"exec-bound-{round_no}"
        occurrence_id, old = _bound_token(runtime, reviewer, execution)
        results = pool.run(
            [(claim_job, {"tenant_id": tenant.pk, "token": old, "execution_id": execution})] * half
            + [(redeliver_job, {"occurrence_id": occurrence_id, "execution_id": execution})]
            * (PROCS - half)
        )
        claims, pickups = results[:half], results[half:]
        approved = [c for c in claims if c[0] == "approved"]
        fresh = [p[1] for p in pickups if p[0] == "token"]
        if approved:
            outcomes["claim first"] += 1
            assert fresh == [], results
            assert {p for p in pickups} == {("refused", "claimed")}, results
            assert {c[0] for c in claims} == {"approved", "duplicate_delivery"}, results
            _assert_one_command(occurrence_id, execution)
        else:
            outcomes["re-delivery first"] += 1
            assert {c[:2] for c in claims} == {("replayed", "token_redelivered")}, results
            # Several fresh tokens were handed out in turn; only the last one is live.
            assert len(fresh) == PROCS - half, results
            live = [
                t
                for t in fresh
                if approval_claim(
                    tenant=tenant,
                    token=t,
                    tool="issue_refund",
                    arguments=dict(REFUND_ARGS),
                    execution_id=execution,
                ).decision
                in ("approved", "duplicate_delivery")
            ]
            assert len(live) == 1, results
            _assert_one_command(occurrence_id, execution)
    assert sum(outcomes.values()) == ROUNDS


def test_one_execution_asking_again_at_once_leaves_one_live_token(
    pool: Pool, tenant: Tenant, reviewer: Any, runtime: Runtime
) -> None:
    for round_no in range(ROUNDS // 5):
        execution = f"exec-again-{round_no}"
        occurrence_id, first = _bound_token(runtime, reviewer, execution)
        results = pool.run(
            [(redeliver_job, {"occurrence_id": occurrence_id, "execution_id": execution})] * PROCS
        )
        assert all(r[0] == "token" for r in results), results
        tokens = [first] + [r[1] for r in results]
        assert len(set(tokens)) == PROCS + 1
        decisions = Counter(
            approval_claim(
                tenant=tenant,
                token=t,
                tool="issue_refund",
                arguments=dict(REFUND_ARGS),
                execution_id=execution,
            ).reason
            for t in tokens
        )
        assert decisions == {"claimed": 1, "token_redelivered": PROCS}, decisions
        approval = Approval.objects.get(occurrence_id=occurrence_id)
        assert approval.retired_tokens.count() == PROCS
        assert (
            AuditEvent.objects.filter(occurrence_id=occurrence_id, kind="token.redelivered").count()
            == PROCS
        )
        _assert_one_command(occurrence_id, execution)


# --- the review -------------------------------------------------------------------------


def _reviewers(tenant: Tenant) -> list[Any]:
    return [make_user(f"reviewer{i}", tenant, Membership.Role.REVIEWER) for i in range(PROCS)]


def _approve_race(
    pool: Pool, runtime: Runtime, reviewers: list[Any], tool: str, args: Any
) -> tuple[Occurrence, list[Any]]:
    occurrence, _ = occurrence_propose(
        runtime_key=runtime.key, tool=tool, arguments=args, run_id="run-race", reason="race"
    )
    digest = occurrence.proposals.get(is_current=True).action_digest
    results = pool.run(
        [
            (
                approve_job,
                {"occurrence_id": str(occurrence.pk), "reviewer_id": r.pk, "seen_digest": digest},
            )
            for r in reviewers
        ]
    )
    return occurrence, results


def test_reviewers_approving_at_once_issue_one_approval(
    pool: Pool, tenant: Tenant, runtime: Runtime
) -> None:
    reviewers = _reviewers(tenant)
    for _ in range(APPROVE_ROUNDS):
        occurrence, results = _approve_race(pool, runtime, reviewers, "send_message", MESSAGE_ARGS)

        assert Counter(results) == {"issued": 1, "not_pending": PROCS - 1}, results
        assert Approval.objects.filter(occurrence=occurrence).count() == 1
        assert ApprovalVote.objects.filter(proposal__occurrence=occurrence).count() == 1
        assert Occurrence.objects.get(pk=occurrence.pk).status == Occurrence.Status.APPROVED
        kinds = Counter(
            AuditEvent.objects.filter(occurrence=occurrence).values_list("kind", flat=True)
        )
        assert kinds == {
            "occurrence.proposed": 1,
            "approval.vote_recorded": 1,
            "approval.issued": 1,
        }


def test_reviewers_racing_on_a_quorum_issue_one_approval_after_two_votes(
    pool: Pool, tenant: Tenant, runtime: Runtime
) -> None:
    reviewers = _reviewers(tenant)
    big_refund = {**REFUND_ARGS, "amount_minor": 50001}
    for _ in range(APPROVE_ROUNDS):
        occurrence, results = _approve_race(pool, runtime, reviewers, "issue_refund", big_refund)

        assert Counter(results) == {"vote 1/2": 1, "issued": 1, "not_pending": PROCS - 2}, results
        approval = Approval.objects.get(occurrence=occurrence)
        voters = set(
            ApprovalVote.objects.filter(proposal__occurrence=occurrence).values_list(
                "reviewer_id", flat=True
            )
        )
        assert len(voters) == 2
        assert approval.approver_id in voters
