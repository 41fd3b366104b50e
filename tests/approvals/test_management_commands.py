"""The operator's commands: tenants, members, runtime keys and the kill switch."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from approvals.access import tokens
from approvals.models import Approval, AuditEvent, Membership, Occurrence, RuntimeKey, Tenant
from tests.conftest import REFUND_ARGS, Runtime, approve

MESSAGE_ARGS = {"to": "dana@example.com", "subject": "Refund", "body": "On its way."}


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    # The fixtures here create several users; the production hasher takes ~0.5 s each.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@dataclass
class Output:
    out: str
    err: str


def run(*args: str, **options: Any) -> Output:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err, **options)
    return Output(out.getvalue(), err.getvalue())


# --- create_tenant --------------------------------------------------------------------


def test_create_tenant_creates_it_with_its_name(db: Any) -> None:
    output = run("create_tenant", "acme", "--name", "Acme Ltd")

    tenant = Tenant.objects.get()
    assert (tenant.slug, tenant.name) == ("acme", "Acme Ltd")
    assert output.out.strip() == "Created tenant acme."


def test_create_tenant_names_it_after_its_slug_by_default(db: Any) -> None:
    run("create_tenant", "acme")

    assert Tenant.objects.get().name == "acme"


def test_create_tenant_refuses_an_existing_slug(tenant: Tenant) -> None:
    with pytest.raises(CommandError, match="already exists"):
        run("create_tenant", tenant.slug)

    assert Tenant.objects.count() == 1


@pytest.mark.parametrize("slug", ["Not a slug", "acme/evil", "", "x" * 65])
def test_create_tenant_refuses_an_invalid_slug(db: Any, slug: str) -> None:
    with pytest.raises(CommandError):
        run("create_tenant", slug)

    assert not Tenant.objects.exists()


# --- add_member -------------------------------------------------------------------------


def test_add_member_creates_the_user_with_the_password_from_the_environment(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEW_PASSWORD", "a long enough password")

    output = run(
        "add_member", "acme", "rita", "--role", "reviewer", "--password-env", "NEW_PASSWORD"
    )

    user = get_user_model().objects.get(username="rita")
    assert user.check_password("a long enough password")
    assert list(Membership.objects.values_list("user__username", "tenant__slug", "role")) == [
        ("rita", "acme", "reviewer")
    ]
    assert output.out.splitlines() == [
        "Created user rita.",
        "Added role reviewer for rita in acme.",
    ]
    assert "a long enough password" not in output.out + output.err


def test_the_new_member_can_sign_in(tenant: Tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEW_PASSWORD", "a long enough password")
    run("add_member", "acme", "rita", "--role", "reviewer", "--password-env", "NEW_PASSWORD")

    assert Client().login(username="rita", password="a long enough password")


def test_add_member_gives_an_existing_user_another_role_without_a_password(
    tenant: Tenant, reviewer: Any
) -> None:
    output = run("add_member", "acme", reviewer.username, "--role", "admin")

    assert set(Membership.objects.filter(user=reviewer).values_list("role", flat=True)) == {
        "reviewer",
        "admin",
    }
    assert output.out.strip() == f"Added role admin for {reviewer.username} in acme."


def test_add_member_does_not_change_an_existing_users_password(
    tenant: Tenant, reviewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEW_PASSWORD", "another long password")

    output = run(
        "add_member", "acme", reviewer.username, "--role", "admin", "--password-env", "NEW_PASSWORD"
    )

    reviewer.refresh_from_db()
    assert not reviewer.check_password("another long password")
    assert "password is unchanged" in output.out


def test_add_member_twice_reports_the_role_it_already_had(tenant: Tenant, reviewer: Any) -> None:
    output = run("add_member", "acme", reviewer.username, "--role", "reviewer")

    assert output.out.strip() == f"Already had role reviewer for {reviewer.username} in acme."
    assert Membership.objects.filter(user=reviewer).count() == 1


@pytest.mark.parametrize("role", ["owner", "Reviewer", ""])
def test_add_member_refuses_an_unknown_role(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    monkeypatch.setenv("NEW_PASSWORD", "a long enough password")

    with pytest.raises(CommandError, match="invalid choice"):
        run("add_member", "acme", "rita", "--role", role, "--password-env", "NEW_PASSWORD")

    assert not get_user_model().objects.filter(username="rita").exists()
    assert not Membership.objects.exists()


def test_add_member_requires_a_role(tenant: Tenant) -> None:
    with pytest.raises(CommandError, match="--role"):
        run("add_member", "acme", "rita")


@pytest.mark.parametrize("value", [None, ""])
def test_add_member_refuses_an_unset_or_empty_password_variable(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("NEW_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("NEW_PASSWORD", value)

    with pytest.raises(CommandError, match="NEW_PASSWORD"):
        run("add_member", "acme", "rita", "--role", "reviewer", "--password-env", "NEW_PASSWORD")

    assert not get_user_model().objects.filter(username="rita").exists()


def test_add_member_refuses_a_password_the_validators_reject(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEW_PASSWORD", "short")

    with pytest.raises(CommandError, match="too short"):
        run("add_member", "acme", "rita", "--role", "reviewer", "--password-env", "NEW_PASSWORD")

    assert not get_user_model().objects.filter(username="rita").exists()


def test_add_member_refuses_an_invalid_username(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEW_PASSWORD", "a long enough password")

    with pytest.raises(CommandError):
        run(
            "add_member",
            "acme",
            "rita smith!",
            "--role",
            "reviewer",
            "--password-env",
            "NEW_PASSWORD",
        )

    assert not get_user_model().objects.exists()


def test_add_member_asks_for_the_password_twice_without_the_variable(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = iter(["a long enough password", "a long enough password"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))

    run("add_member", "acme", "rita", "--role", "operator")

    assert get_user_model().objects.get(username="rita").check_password("a long enough password")


def test_add_member_refuses_passwords_that_differ(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = iter(["a long enough password", "a different password"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))

    with pytest.raises(CommandError, match="differ"):
        run("add_member", "acme", "rita", "--role", "operator")

    assert not get_user_model().objects.filter(username="rita").exists()


def test_add_member_refuses_an_unknown_tenant(db: Any) -> None:
    with pytest.raises(CommandError, match="No tenant"):
        run("add_member", "nowhere", "rita", "--role", "reviewer")


# --- create_runtime_key -------------------------------------------------------------------


def test_create_runtime_key_prints_the_key_once_as_the_last_line(tenant: Tenant) -> None:
    output = run("create_runtime_key", "acme", "support-agent")

    raw = output.out.splitlines()[-1]
    key = RuntimeKey.objects.get()
    assert output.out == raw + "\n"
    assert (output.out + output.err).count(raw) == 1
    assert raw.startswith(tokens.RUNTIME_KEY_PREFIX)
    assert key.name == "support-agent"
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert "support-agent" in output.err


def test_the_printed_key_works_against_the_api(tenant: Tenant) -> None:
    raw = run("create_runtime_key", "acme", "support-agent").out.splitlines()[-1]
    runtime = Runtime(
        key=RuntimeKey.objects.get(),
        raw_key=raw,
        client=Client(HTTP_AUTHORIZATION=f"Bearer {raw}"),
    )

    response = runtime.propose()

    assert response.status_code == 201
    assert Occurrence.objects.get().tenant == tenant


def test_each_runtime_key_is_different(tenant: Tenant) -> None:
    first = run("create_runtime_key", "acme", "one").out.strip()
    second = run("create_runtime_key", "acme", "two").out.strip()

    assert first != second


def test_create_runtime_key_refuses_a_duplicate_name(tenant: Tenant) -> None:
    run("create_runtime_key", "acme", "support-agent")

    with pytest.raises(CommandError, match="already has a key"):
        run("create_runtime_key", "acme", "support-agent")

    assert RuntimeKey.objects.count() == 1


@pytest.mark.parametrize("name", ["", "   ", "n" * 101])
def test_create_runtime_key_refuses_an_empty_or_overlong_name(tenant: Tenant, name: str) -> None:
    with pytest.raises(CommandError):
        run("create_runtime_key", "acme", name)

    assert not RuntimeKey.objects.exists()


def test_create_runtime_key_refuses_an_unknown_tenant(db: Any) -> None:
    with pytest.raises(CommandError, match="No tenant"):
        run("create_runtime_key", "nowhere", "agent")


# --- revoke_approvals -------------------------------------------------------------------


def test_revoke_by_fingerprint_revokes_that_approval_and_a_later_claim_is_revoked(
    runtime: Runtime, token: str
) -> None:
    output = run(
        "revoke_approvals", "--fingerprint", tokens.fingerprint(token), "--reason", "incident 7"
    )

    assert output.out.strip() == "Revoked 1 approval(s)."
    approval = Approval.objects.get()
    assert approval.state == Approval.State.REVOKED
    assert (approval.revoked_by, approval.revoke_reason) == ("cli:revoke_approvals", "incident 7")
    event = AuditEvent.objects.get(kind="approval.revoked")
    assert (event.reason_code, event.token_fingerprint) == (
        "revoked_by_admin",
        approval.fingerprint,
    )
    assert Occurrence.objects.get().status == Occurrence.Status.REVOKED
    claim = runtime.claim(token, "exec-a")
    assert claim.status_code == 403
    assert {k: claim.json()[k] for k in ("decision", "reason")} == {
        "decision": "revoked",
        "reason": "revoked_by_admin",
    }


def test_revoke_by_a_retired_fingerprint_revokes_its_approval(
    runtime: Runtime, approved: str
) -> None:
    path = f"/api/v1/occurrences/{approved}/token"
    retired = runtime.post(path, {"execution_id": "exec-a"}).json()["fingerprint"]
    fresh = runtime.post(path, {"execution_id": "exec-a"}).json()["token"]

    output = run("revoke_approvals", "--fingerprint", retired, "--reason", "old log line")

    assert output.out.strip() == "Revoked 1 approval(s)."
    assert Approval.objects.get().state == Approval.State.REVOKED
    assert runtime.claim(fresh, "exec-a").json()["decision"] == "revoked"


def test_revoke_by_fingerprint_leaves_other_approvals_alone(
    runtime: Runtime, token: str, reviewer: Any
) -> None:
    other = runtime.propose(arguments={**REFUND_ARGS, "payment_id": "pay_9"}).json()
    approve(other["occurrence_id"], reviewer)
    other_token = runtime.token(other["occurrence_id"]).json()["token"]

    run("revoke_approvals", "--fingerprint", tokens.fingerprint(token), "--reason", "incident")

    assert runtime.claim(token, "exec-a").json()["decision"] == "revoked"
    claim = runtime.claim(other_token, "exec-b", arguments={**REFUND_ARGS, "payment_id": "pay_9"})
    assert claim.json()["decision"] == "approved"


def test_revoking_a_consumed_approval_revokes_nothing(runtime: Runtime, token: str) -> None:
    runtime.claim(token, "exec-a")

    output = run("revoke_approvals", "--fingerprint", tokens.fingerprint(token), "--reason", "late")

    assert output.out.strip() == "Revoked 0 approval(s)."
    assert Approval.objects.get().state == Approval.State.CONSUMED
    assert runtime.claim(token, "exec-a").json()["decision"] == "duplicate_delivery"


@pytest.fixture
def three_approvals(
    runtime: Runtime, other_runtime: Runtime, reviewer: Any, second_reviewer: Any, other_tenant: Any
) -> dict[str, str]:
    """Issued approvals in acme: a refund by rita, a message by ravi; one in globex."""
    from tests.conftest import make_user

    refund = runtime.propose().json()["occurrence_id"]
    approve(refund, reviewer)
    message = runtime.propose("send_message", MESSAGE_ARGS).json()["occurrence_id"]
    approve(message, second_reviewer)
    theirs = other_runtime.propose("send_message", MESSAGE_ARGS).json()["occurrence_id"]
    approve(theirs, make_user("gina", other_tenant, Membership.Role.REVIEWER))
    return {"refund": refund, "message": message, "theirs": theirs}


def states(occurrences: dict[str, str]) -> dict[str, str]:
    return {name: Approval.objects.get(occurrence_id=pk).state for name, pk in occurrences.items()}


def test_revoke_a_tenant_revokes_all_its_issued_approvals_and_no_one_elses(
    runtime: Runtime, three_approvals: dict[str, str]
) -> None:
    output = run("revoke_approvals", "--tenant", "acme", "--reason", "key leaked")

    assert output.out.strip() == "Revoked 2 approval(s)."
    assert states(three_approvals) == {
        "refund": "revoked",
        "message": "revoked",
        "theirs": "issued",
    }
    pickup = runtime.token(three_approvals["refund"])
    assert (pickup.status_code, pickup.json()["error"]["code"]) == (409, "revoked")
    assert "key leaked" in pickup.json()["error"]["message"]


def test_revoke_a_tenant_by_approver_revokes_only_their_approvals(
    three_approvals: dict[str, str], second_reviewer: Any
) -> None:
    output = run(
        "revoke_approvals",
        "--tenant",
        "acme",
        "--approver",
        second_reviewer.username,
        "--reason",
        "account compromised",
    )

    assert output.out.strip() == "Revoked 1 approval(s)."
    assert states(three_approvals) == {"refund": "issued", "message": "revoked", "theirs": "issued"}


def test_revoke_a_tenant_by_tool_revokes_only_that_tools_approvals(
    three_approvals: dict[str, str],
) -> None:
    output = run(
        "revoke_approvals", "--tenant", "acme", "--tool", "issue_refund", "--reason", "refund bug"
    )

    assert output.out.strip() == "Revoked 1 approval(s)."
    assert states(three_approvals) == {"refund": "revoked", "message": "issued", "theirs": "issued"}


def test_revoke_twice_revokes_nothing_the_second_time(three_approvals: dict[str, str]) -> None:
    run("revoke_approvals", "--tenant", "acme", "--reason", "incident")

    output = run("revoke_approvals", "--tenant", "acme", "--reason", "incident")

    assert output.out.strip() == "Revoked 0 approval(s)."
    assert AuditEvent.objects.filter(kind="approval.revoked").count() == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reason", "x"], "one of the arguments --fingerprint --tenant is required"),
        (["--tenant", "acme"], "--reason"),
        (["--tenant", "acme", "--reason", "  "], "Say why"),
        (["--fingerprint", "", "--reason", "x"], "--fingerprint is empty"),
        (["--fingerprint", "abc", "--tenant", "acme", "--reason", "x"], "not allowed with"),
        (["--fingerprint", "abc", "--approver", "rita", "--reason", "x"], "go with --tenant"),
        (["--tenant", "nowhere", "--reason", "x"], "No tenant"),
        (["--tenant", "acme", "--approver", "nobody", "--reason", "x"], "No user"),
        (["--tenant", "acme", "--tool", "format_disk", "--reason", "x"], "No tool contract"),
    ],
)
def test_revoke_refuses_unclear_instructions_and_revokes_nothing(
    three_approvals: dict[str, str], args: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        run("revoke_approvals", *args)

    assert set(states(three_approvals).values()) == {"issued"}


# --- revoke_approvals: the filters of the console's bulk revocation, --dry-run ---------------


def test_revoke_by_runtime_key_revokes_only_what_that_key_proposed(
    three_approvals: dict[str, str], tenant: Tenant, reviewer: Any
) -> None:
    from tests.conftest import make_runtime

    batch = make_runtime(tenant, "batch-agent")
    theirs = batch.propose(arguments={**REFUND_ARGS, "payment_id": "pay_batch"}).json()
    approve(theirs["occurrence_id"], reviewer)

    output = run(
        "revoke_approvals", "--tenant", "acme", "--runtime-key", "batch-agent", "--reason", "leak"
    )

    assert output.out.strip() == "Revoked 1 approval(s)."
    assert Approval.objects.get(occurrence_id=theirs["occurrence_id"]).state == "revoked"
    assert set(states(three_approvals).values()) == {"issued"}


def test_revoke_issued_before_a_time_leaves_later_approvals(
    three_approvals: dict[str, str],
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    early = timezone.now() - timedelta(minutes=10)
    Approval.objects.filter(occurrence_id=three_approvals["refund"]).update(issued_at=early)
    cutoff = (early + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")  # UTC, no offset

    output = run(
        "revoke_approvals", "--tenant", "acme", "--issued-before", cutoff, "--reason", "incident"
    )

    assert output.out.strip() == "Revoked 1 approval(s)."
    assert states(three_approvals) == {"refund": "revoked", "message": "issued", "theirs": "issued"}


def test_dry_run_prints_the_count_and_the_list_and_revokes_nothing(
    three_approvals: dict[str, str],
) -> None:
    output = run("revoke_approvals", "--tenant", "acme", "--tool", "issue_refund", "--dry-run")

    lines = output.out.splitlines()
    assert lines[0] == "Would revoke 1 approval(s) (dry run: nothing changed)."
    assert len(lines) == 2
    approval = Approval.objects.get(occurrence_id=three_approvals["refund"])
    assert "issue_refund" in lines[1] and "approver=rita" in lines[1]
    assert "amount=EUR 80.00" in lines[1] and f"occurrence={approval.occurrence_id}" in lines[1]
    assert approval.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ") in lines[1]
    assert set(states(three_approvals).values()) == {"issued"}
    assert not AuditEvent.objects.filter(kind="approval.revoked").exists()


def test_dry_run_by_fingerprint_names_the_approval(runtime: Runtime, token: str) -> None:
    fingerprint = tokens.fingerprint(token)

    output = run("revoke_approvals", "--fingerprint", fingerprint, "--dry-run")

    assert output.out.splitlines()[0] == "Would revoke 1 approval(s) (dry run: nothing changed)."
    assert output.out.splitlines()[1].startswith(fingerprint)
    assert Approval.objects.get().state == Approval.State.ISSUED


def test_revoking_a_consumed_approval_says_why_naming_its_command_and_effect(
    runtime: Runtime, token: str
) -> None:
    from approvals.models import Command

    runtime.claim(token, "exec-a")
    command = Command.objects.get()

    output = run("revoke_approvals", "--fingerprint", tokens.fingerprint(token), "--reason", "late")
    dry = run("revoke_approvals", "--fingerprint", tokens.fingerprint(token), "--dry-run")

    assert output.out.strip() == "Revoked 0 approval(s)."
    for err in (output.err, dry.err):
        assert "consumed by execution exec-a" in err
        assert f"command {command.pk}" in err
        assert f"{command.get_state_display().lower()} ({command.state})" in err
    assert Approval.objects.get().state == Approval.State.CONSUMED


def test_an_unknown_fingerprint_is_said_so(db: Any) -> None:
    output = run("revoke_approvals", "--fingerprint", "0123456789abcdef", "--reason", "x")

    assert output.out.strip() == "Revoked 0 approval(s)."
    assert "No approval has the fingerprint '0123456789abcdef'" in output.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "acme", "--runtime-key", "nope", "--reason", "x"], "No runtime key 'nope'"),
        (["--tenant", "acme", "--issued-before", "yesterday", "--reason", "x"], "ISO 8601"),
        (["--fingerprint", "abc", "--runtime-key", "agent", "--reason", "x"], "go with --tenant"),
        (["--fingerprint", "abc", "--issued-before", "2025-01-01", "--reason", "x"], "--tenant"),
        (["--tenant", "acme"], "--reason"),
    ],
)
def test_revoke_refuses_unclear_new_filters_and_revokes_nothing(
    three_approvals: dict[str, str], args: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        run("revoke_approvals", *args)

    assert set(states(three_approvals).values()) == {"issued"}
