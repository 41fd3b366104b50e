"""Issue 24: the console's words and refusal codes are typed once, in
``approvals/vocabulary.py`` and ``approvals/errors.py``. The sources of ``approvals``,
``reconciliation`` and ``config`` are read with ``ast`` (the vocabulary modules, migrations
and tests aside): a word of these vocabularies typed as a string where it is compared,
keys a table or spells an API schema's ``Literal`` fails here, and so does a refusal's
code typed in place (``ServiceError("forbidden", ...)``) instead of an ``ErrorCode``
member. Audit kinds have their scan in ``test_vocabulary_audit_kinds.py``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from django.db import models

from approvals import vocabulary
from approvals.errors import ErrorCode
from approvals.vocabulary import (
    QUEUE_REASONS,
    EventDecision,
    PanelState,
    PriorDecision,
    QueueReason,
    ReviewOutcome,
    ReviewOutcomeLiteral,
    literal_values,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("approvals", "reconciliation", "gateway", "config")
# The homes of the words, and modules that cannot import them: the settings (a logging
# handler called "console" is no executor) and ``replay_scan``, which runs without Django
# (its copies are held equal by ``test_vocabulary_audit_kinds.test_the_surfaces_name_members``).
EXEMPT = {
    ROOT / "approvals" / "vocabulary.py",
    ROOT / "approvals" / "errors.py",
    ROOT / "config" / "settings.py",
    ROOT / "approvals" / "audit" / "replay_scan.py",
}
# Calls whose first argument (or ``code=``) is a refusal's code.
CODE_TAKERS = {"ServiceError", "Refused", "error_response"}


def vocabularies() -> dict[str, set[str]]:
    """Each vocabulary's words by its name. Audit kinds are dotted and scanned apart."""
    found: dict[str, set[str]] = {
        name: set(value.values)
        for name, value in vars(vocabulary).items()
        if isinstance(value, type)
        and issubclass(value, models.Choices)
        and value.__module__ == vocabulary.__name__
        and value is not vocabulary.AuditKind
    }
    for name in ("EffectState", "ExecutedBy", "PriorDecision", "ReviewOutcomeLiteral"):
        found[name] = set(literal_values(getattr(vocabulary, name)))
    found["ErrorCode"] = {code.value for code in ErrorCode}
    return found


WORDS = set().union(*vocabularies().values())


def sources() -> Iterator[tuple[Path, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or path in EXEMPT:
                continue
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _word(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in WORDS


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _elements(node: ast.expr) -> list[ast.expr]:
    """A side of a comparison: itself, or the items of a tuple, list or set (``in``)."""
    return list(node.elts) if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]


def words_typed_in(tree: ast.AST) -> list[ast.expr]:
    """Words of the vocabularies typed as strings where the code means the word: compared
    (``state == "pending"``, ``code in ("forbidden", ...)``), as the keys of a table keyed
    by words, in a ``Literal[...]``; and any string passed as a refusal's code."""
    suspects: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                suspects += [e for e in _elements(side) if _word(e)]
        elif isinstance(node, ast.Dict):
            keys = [key for key in node.keys if key is not None]
            if keys and all(_word(key) for key in keys):
                suspects += keys
        elif isinstance(node, ast.Subscript) and _name(node.value) == "Literal":
            suspects += [e for e in _elements(node.slice) if _word(e)]
        elif isinstance(node, ast.Call) and _name(node.func) in CODE_TAKERS:
            codes = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "code")]
            suspects += [
                code
                for code in codes
                if isinstance(code, ast.Constant | ast.JoinedStr)
                and (isinstance(code, ast.JoinedStr) or isinstance(code.value, str))
            ]
    return suspects


def _where(suspect: ast.expr) -> str:
    if isinstance(suspect, ast.Constant):
        homes = sorted(name for name, words in vocabularies().items() if suspect.value in words)
        if homes:
            return f"{ast.unparse(suspect)} (a word of {', '.join(homes)})"
    return f"{ast.unparse(suspect)} (a refusal's code: add it to ErrorCode)"


def test_no_word_or_code_is_typed_as_a_string() -> None:
    """``decision.state == "consumed"``, ``{"not_pending": ...}``, ``Literal["rejected"]``
    or ``ServiceError("forbidden", ...)`` outside the vocabulary modules fails here: use
    the member (``PanelState.CONSUMED``, ``ErrorCode.FORBIDDEN``)."""
    found = [
        f"{path.relative_to(ROOT)}:{suspect.lineno}: {_where(suspect)}"
        for path, tree in sources()
        for suspect in words_typed_in(tree)
    ]
    assert found == []


def test_the_scan_sees_a_typed_word() -> None:
    """The scan itself: each way of typing a word or a code in place is caught, and the
    members, other strings and a JSON body's field names are not."""
    code = (
        'if decision.state == "consumed": pass\n'
        'if reason in ("stuck_sending", QueueReason.INTERRUPTED): pass\n'
        'if outcome != ReportedOutcome.INTERRUPTED and exc.code == "stale_digest": pass\n'
        'REFUSALS = {"not_pending": "Decided first.", "not_editable": "Too late."}\n'
        'effect_state: Literal["not_sent", "sending"]\n'
        'raise ServiceError("no_such_code", "Refused.", 409)\n'
        'raise Refused(code="state_changed", message="Refused.")\n'
        'return error_response(f"{kind}_failed", "Refused.", 400)\n'
        # Not words typed in place: members, other strings, a body's fields, a method.
        'if exc.code == ErrorCode.FORBIDDEN and request.method == "POST": pass\n'
        'body = {"revoked": 3, "reason": why}\n'
        'raise ServiceError(ErrorCode.NOT_FOUND, "No such command.", 404)\n'
    )
    suspects = words_typed_in(ast.parse(code))
    assert sorted(ast.unparse(s) for s in suspects) == sorted(
        [
            "'consumed'",
            "'stuck_sending'",
            "'stale_digest'",
            "'not_pending'",
            "'not_editable'",
            "'not_sent'",
            "'sending'",
            "'no_such_code'",
            "'state_changed'",
            "f'{kind}_failed'",
        ]
    )


def test_the_scan_reads_every_package() -> None:
    """A renamed package or module would leave the scan reading nothing."""
    read = {path for path, _tree in sources()}
    for package in PACKAGES:
        assert any(path.is_relative_to(ROOT / package) for path in read), package
    assert all(path.exists() for path in EXEMPT)


def test_the_vocabularies_keep_their_words() -> None:
    """Stored and sent strings: each stays a member with this very value."""
    assert set(PanelState.values) == {
        "pending",
        "awaiting_quorum",
        "issued",
        "delivered",
        "consumed",
        "rejected",
        "revoked",
        "expired",
        "auto_admitted",
        "timed_out",
    }
    assert set(QUEUE_REASONS) == set(QueueReason)
    assert len(QUEUE_REASONS) == len(set(QUEUE_REASONS))
    assert literal_values(PriorDecision) == (EventDecision.REJECTED, EventDecision.TIMED_OUT)
    assert literal_values(ReviewOutcomeLiteral) == tuple(ReviewOutcome.values)
    assert set(vocabulary.REVIEW_DECISION_KINDS) <= set(vocabulary.DECISION_WORDS)


# Every code an answer or a page has given: clients branch on these, so each stays.
STORED_CODES = {
    "bad_request",
    "unauthenticated",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "empty_body",
    "payload_too_large",
    "unsupported_media_type",
    "rate_limited",
    "database_unavailable",
    "server_error",
    "client_ref_conflict",
    "not_pending",
    "pending_review",
    "self_approval",
    "stale_digest",
    "not_editable",
    "timed_out",
    "not_approved",
    "auto_admitted",
    "rejected",
    "revoked",
    "expired",
    "not_expired",
    "claimed",
    "token_already_delivered",
    "other_runtime_key",
    "not_your_command",
    "epoch_changed",
    "executed_by_console",
    "contract_not_registrable",
    "effect_already_recorded",
    "effect_committed",
    "needs_reconciliation",
    "execution_id_used",
    "no_command",
    "note_required",
    "outcome_required",
    "evidence_required",
    "seen_state_invalid",
    "state_changed",
    "not_committed",
    "not_justified",
    "cannot_query",
    "cannot_compensate",
    "no_receipt",
    "compensation_in_progress",
    "compensation_failed",
    "secret_required",
    "taken_by_other",
    "not_holder",
}


def test_error_codes_keep_their_values() -> None:
    assert {code.value for code in ErrorCode} == STORED_CODES
    for code in ErrorCode:
        assert code.name.lower() == code.value, code
        assert str(code) == code.value and f"{code}" == code.value
