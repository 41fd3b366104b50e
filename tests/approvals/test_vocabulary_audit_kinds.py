"""Issue 10: audit event kinds are typed once (``approvals.vocabulary.AuditKind``).

The sources of ``approvals`` and ``reconciliation`` are read with ``ast``: wherever an
audit kind is written (``audit_record``, ``audit_event_new``, ``dispatch._audit``) or
matched (a query on ``kind``, a comparison with ``.kind``), a dotted string typed in place
fails, and so does a member that nothing writes."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from approvals import metrics, vocabulary
from approvals.access import ratelimit
from approvals.audit import replay_scan
from approvals.models import Command
from approvals.vocabulary import CLAIM_PREFIX, AuditKind, ClaimDecision
from reconciliation.effects import _STATE_FOR_REPORT
from reconciliation.investigations.facts import COMMITTED_KIND, REDELIVERED_KIND
from reconciliation.models import OperatorDecision

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("approvals", "reconciliation", "gateway")
VOCABULARY = ROOT / "approvals" / "vocabulary.py"
# Modules that run without Django and so cannot import the vocabulary: their copies of a
# kind are held equal to the member by ``test_the_surfaces_name_members``.
NO_DJANGO = {ROOT / "approvals" / "audit" / "replay_scan.py"}
# A kind (``claim.approved``) or a family's prefix (``claim.``).
DOTTED = re.compile(r"^[a-z_]+\.[a-z_]*$")
# Where a kind is written: ``audit_record`` appends one event; ``audit_event_new`` builds
# one for a statement that writes it with its change (the claim's) or for ``audit_append``
# (a proposal's events in one INSERT); ``dispatch._audit`` is the worker's.
WRITERS = {"audit_record", "audit_event_new", "_audit"}
QUERIES = {"filter", "exclude", "get", "create", "update", "get_or_create", "update_or_create"}
KIND_LOOKUPS = re.compile(r"^kind(__(in|startswith|istartswith|exact|iexact))?$")

# Every kind the console has ever stored: rows and the audit chain's hashes hold these
# strings, so each stays a member with this very value. Add new kinds here; never edit one.
STORED = {
    "runtime_key.created",
    "runtime_key.deactivated",
    "runtime_key.reactivated",
    "reviewer_token.created",
    "reviewer_token.revoked",
    "callback.registered",
    "callback.removed",
    "routing.group_saved",
    "routing.rule_saved",
    "routing.rule_removed",
    "tool_contract.registered",
    "occurrence.proposed",
    "occurrence.auto_admitted",
    "occurrence.rejected",
    "occurrence.renewed",
    "occurrence.escalated",
    "occurrence.timed_out",
    "proposal.edited",
    "approval.vote_recorded",
    "approval.issued",
    "approval.expired",
    "approval.revoked",
    "token.delivered",
    "token.redelivered",
    "claim.approved",
    "claim.duplicate_delivery",
    "claim.replayed",
    "claim.scope_mismatch",
    "claim.expired",
    "claim.revoked",
    "claim.unknown_token",
    "security.refusals_burst",
    "effect.sending",
    "effect.committed",
    "effect.rejected",
    "effect.outcome_unknown",
    "effect.retry_scheduled",
    "effect.late_result",
    "effect.report_refused",
    "dispatch.redelivered",
    "recovery.interrupted",
    "credentials.refreshed",
    "epoch.admitted",
    "epoch.waiting",
    "operator.query_effect",
    "operator.reconcile",
    "operator.accept_ambiguity",
    "operator.retry",
    "operator.compensate",
    "operations.escalated",
    "operations.taken",
    "operations.taken_over",
    "operations.released",
}


def sources() -> Iterator[tuple[Path, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or path == VOCABULARY:
                continue
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _kind_arguments(call: ast.Call) -> Iterator[ast.expr]:
    """The expressions a call passes as an audit kind (written or looked up)."""
    name = _name(call.func)
    if name in WRITERS:
        if name == "_audit" and len(call.args) > 1:
            yield call.args[1]
        yield from (k.value for k in call.keywords if k.arg == "kind")
    elif name in QUERIES:
        yield from (k.value for k in call.keywords if k.arg and KIND_LOOKUPS.match(k.arg))


def _is_kind(node: ast.expr) -> bool:
    """``x.kind`` (an event's kind) or a bare ``kind`` variable."""
    return (isinstance(node, ast.Attribute) and node.attr == "kind") or (
        isinstance(node, ast.Name) and node.id == "kind"
    )


def _typed_in_place(node: ast.expr) -> Iterator[ast.expr]:
    """Dotted strings and f-strings inside ``node``: a kind typed instead of a member."""
    if isinstance(node, ast.JoinedStr):
        yield node
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, str) and DOTTED.match(node.value):
            yield node
    else:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                yield from _typed_in_place(child)


def typed_in(tree: ast.AST) -> list[ast.expr]:
    """Kinds typed in place in ``tree``: dotted strings and f-strings written as an audit
    kind, looked up as one, compared with ``.kind`` or used as a prefix of it."""
    suspects: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for argument in _kind_arguments(node):
                suspects += _typed_in_place(argument)
            # event.kind.startswith("effect.")
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in ("startswith", "endswith")
                and _is_kind(node.func.value)
            ):
                for argument in node.args:
                    suspects += _typed_in_place(argument)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(side) for side in sides):
                for side in sides:
                    suspects += _typed_in_place(side)
    return suspects


def typed_kinds() -> list[str]:
    found = []
    for path, tree in sources():
        if path in NO_DJANGO:
            continue
        for suspect in typed_in(tree):
            member = isinstance(suspect, ast.Constant) and suspect.value in AuditKind.values
            found.append(
                f"{path.relative_to(ROOT)}:{suspect.lineno}: {ast.unparse(suspect)}"
                + (" (use the AuditKind member)" if member else " (not an AuditKind member)")
            )
    return found


def written_members() -> set[AuditKind]:
    """Members passed as the kind of ``audit_record``/``_audit``, directly or through a
    module constant (``ratelimit.BURST_EVENT``), plus what the builders can produce."""
    written: set[AuditKind] = set()
    for _path, tree in sources():
        constants = {
            target.id: node.value.attr
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _name(node.func) in WRITERS):
                continue
            for argument in _kind_arguments(node):
                for sub in ast.walk(argument):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "AuditKind"
                        and sub.attr in AuditKind.names
                    ):
                        written.add(AuditKind[sub.attr])
                    elif isinstance(sub, ast.Name) and constants.get(sub.id) in AuditKind.names:
                        written.add(AuditKind[constants[sub.id]])
    # The builders: every refused claim decision, every operator action, and every state
    # an effect is settled in (by the worker or a runtime's report).
    written |= {AuditKind.for_claim(d) for d in ClaimDecision if d != ClaimDecision.APPROVED}
    written |= {AuditKind.for_operator(a) for a in OperatorDecision.Action}
    written |= {AuditKind.for_effect(state) for state in set(_STATE_FOR_REPORT.values())}
    return written


def test_no_audit_kind_is_typed_as_a_string() -> None:
    """A kind written or matched as ``"claim.approved"`` (or an f-string) instead of
    ``AuditKind.CLAIM_APPROVED`` fails here, a misspelt one included."""
    assert typed_kinds() == []


def test_the_scan_sees_a_typed_kind() -> None:
    """The scan itself: each way of typing a kind in place is caught."""
    code = (
        'audit_record(kind="claim.approvd", tenant=t)\n'
        '_audit(command, f"effect.{state}")\n'
        'events.filter(kind__in=("epoch.admitted", AuditKind.EPOCH_WAITING))\n'
        'if event.kind == "approval.revoked": pass\n'
        'if event.kind.startswith("operator."): pass\n'
    )
    suspects = typed_in(ast.parse(code))
    assert sorted(ast.unparse(s) for s in suspects) == [
        "'approval.revoked'",
        "'claim.approvd'",
        "'epoch.admitted'",
        "'operator.'",
        "f'effect.{state}'",
    ]


def test_every_member_is_written_somewhere() -> None:
    """No dead member: a kind nothing writes is not in the vocabulary."""
    assert set(AuditKind) - written_members() == set()


def test_stored_kinds_keep_their_values() -> None:
    assert set(AuditKind.values) >= STORED, "a stored kind was renamed or removed"
    assert set(AuditKind.values) == STORED, "a new kind: add it to STORED too"
    for member in AuditKind:
        assert DOTTED.match(member.value), member
        assert member.label and member.label != member.value, member


def test_the_builders_make_members_or_refuse() -> None:
    assert AuditKind.for_claim(ClaimDecision.REPLAYED) is AuditKind.CLAIM_REPLAYED
    assert AuditKind.for_claim("unknown_token") is AuditKind.CLAIM_UNKNOWN_TOKEN
    assert AuditKind.for_effect(Command.State.COMMITTED) is AuditKind.EFFECT_COMMITTED
    assert (
        AuditKind.for_operator(OperatorDecision.Action.ACCEPT_AMBIGUITY)
        is AuditKind.OPERATOR_ACCEPT_AMBIGUITY
    )
    # Stored as the very string the f-string used to build.
    assert AuditKind.for_claim(ClaimDecision.SCOPE_MISMATCH) == "claim.scope_mismatch"
    assert str(AuditKind.for_effect("outcome_unknown")) == "effect.outcome_unknown"
    for refused in (
        lambda: AuditKind.for_claim("approvd"),
        lambda: AuditKind.for_effect(Command.State.PENDING),
        lambda: AuditKind.for_operator("shrug"),
    ):
        with pytest.raises(ValueError):
            refused()


def test_the_surfaces_name_members() -> None:
    assert all(isinstance(kind, AuditKind) for kind in vocabulary.DECISION_WORDS)
    assert set(vocabulary.REVIEW_DECISION_KINDS) <= set(vocabulary.DECISION_WORDS)
    assert all(isinstance(kind, AuditKind) for kind in metrics._DECISIONS)
    assert all(isinstance(kind, AuditKind) for kind in vocabulary.EFFECT_KINDS)
    assert isinstance(ratelimit.BURST_EVENT, AuditKind)
    assert isinstance(COMMITTED_KIND, AuditKind)
    assert isinstance(REDELIVERED_KIND, AuditKind)
    # replay_scan runs without Django (the bench imports it bare): its copy is held here.
    assert replay_scan.CLAIM_APPROVED_KIND == AuditKind.CLAIM_APPROVED
    assert AuditKind.CLAIM_APPROVED.startswith(CLAIM_PREFIX)


# --- an event's decision and reason ------------------------------------------------------

# Writers of an audit event's ``decision`` and ``reason_code`` (``dispatch._settle`` passes
# its reason on to ``_audit``).
EVENT_WORD_WRITERS = WRITERS | {"_settle"}
EVENT_WORDS = ("decision", "reason_code")

# Every decision and reason the console has stored on an event that is no claim: rows and
# the chain's hashes hold them, so each stays a member with this very value.
STORED_EVENT_DECISIONS = {
    "issued",
    "rejected",
    "auto_admitted",
    "deactivated",
    "reactivated",
    "ignored",
    "interrupted",
    "admitted",
    "waiting",
    "authority_restored",
    "refused",
    "delivered",
    "failed",
    "taken",
    "taken_over",
    "released",
    "escalated",
    "timed_out",
}
STORED_EVENT_REASONS = {
    "rejected_by_reviewer",
    "repeat_of_rejected",
    "policy_read_only",
    "approval_expired",
    "approval_superseded",
    "expired_unclaimed",
    "review_deadline_passed",
    "final_deadline_passed",
    "refusals_burst",
    "other_execution",
    "attempts_exhausted",
    "auth_challenge",
    "refused_before_execution",
    "ambiguous",
    "already_committed",
    "already_rejected",
    "already_outcome_unknown",
    "already_reconciled",
    "already_compensated",
    "reported_committed",
    "reported_rejected",
    "reported_outcome_unknown",
    "reported_interrupted",
    "let_go",
    "resolved",
}


def event_words_typed_in(tree: ast.AST) -> list[ast.expr]:
    """Strings (and f-strings) typed in place as the decision or reason of an event."""
    suspects: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in EVENT_WORD_WRITERS:
            for keyword in node.keywords:
                if keyword.arg not in EVENT_WORDS:
                    continue
                suspects += _strings_in(keyword.value)
    return suspects


def _strings_in(node: ast.expr) -> Iterator[ast.expr]:
    """Non-empty string constants and f-strings (whole) in ``node``."""
    if isinstance(node, ast.JoinedStr):
        yield node
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, str) and node.value:
            yield node
    else:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                yield from _strings_in(child)


def test_no_event_decision_or_reason_is_typed_as_a_string() -> None:
    """``decision="rejected"`` or ``reason_code=f"already_{state}"`` where an event is
    written fails here: the words are ``ClaimDecision``/``EventDecision`` and
    ``ClaimReason``/``EventReason`` members (or another typed enum's, such as an
    invocation's justification)."""
    found = [
        f"{path.relative_to(ROOT)}:{suspect.lineno}: {ast.unparse(suspect)}"
        for path, tree in sources()
        for suspect in event_words_typed_in(tree)
    ]
    assert found == []


def test_the_scan_sees_a_typed_event_word() -> None:
    code = (
        'audit_record(kind=AuditKind.X, decision="rejected", reason_code=EventReason.AMBIGUOUS)\n'
        '_settle(command, None, state, reason_code=f"already_{state}")\n'
        '_audit(command, AuditKind.Y, decision=EventDecision.IGNORED, reason_code="")\n'
    )
    suspects = event_words_typed_in(ast.parse(code))
    assert sorted(ast.unparse(s) for s in suspects) == ["'rejected'", "f'already_{state}'"]


def test_stored_event_words_keep_their_values() -> None:
    assert set(vocabulary.EventDecision.values) == STORED_EVENT_DECISIONS
    assert set(vocabulary.EventReason.values) == STORED_EVENT_REASONS
    settled = {"committed", "rejected", "outcome_unknown", "reconciled", "compensated"}
    assert {vocabulary.EventReason.already(state) for state in settled} == {
        reason for reason in vocabulary.EventReason if reason.startswith(vocabulary.ALREADY_PREFIX)
    }
    with pytest.raises(ValueError):
        vocabulary.EventReason.already(Command.State.PENDING)
    assert {vocabulary.EventReason.reported(outcome) for outcome in vocabulary.ReportedOutcome} == {
        reason for reason in vocabulary.EventReason if reason.startswith(vocabulary.REPORTED_PREFIX)
    }
