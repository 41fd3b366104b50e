"""The review page's reads: the occurrence with its versions, votes and approvals, what the
panel shows of it, its effect evidence, and the stamp a poll compares."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import (
    Count,
    F,
    Max,
    OuterRef,
    Prefetch,
    QuerySet,
    Subquery,
)
from django.utils import timezone

from approvals import vocabulary
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Command,
    Membership,
    Occurrence,
    Proposal,
    RuntimeKey,
    Tenant,
    ToolContract,
)
from approvals.reviews.selectors import approval_state
from approvals.sql import Columns, fetch, on_postgresql, split, words
from approvals.vocabulary import AuditKind, PanelState
from approvals.web.selectors.access import tenant_reviewer_names
from approvals.web.selectors.history import (
    NEWEST,
    ClaimTally,
    HistoryCursor,
    HistoryWindow,
    _pk,
    claim_tally_of_events,
    claim_tally_of_history,
    occurrence_history,
    rejected_by,
)


def _freshness_annotations() -> dict[str, Any]:
    """What tells an open review page that it is out of date, as annotations of its
    occurrence: every decision, delivery, claim, edit and revocation writes an audit
    event; a command's state changes without one, and an approval expires by the clock."""
    current_approval = Approval.objects.filter(occurrence=OuterRef("pk"), proposal__is_current=True)
    reviewers = (
        Membership.objects.filter(tenant=OuterRef("tenant"), role=Membership.Role.REVIEWER)
        .order_by()
        .values("tenant")
    )
    return {
        "fresh_event_id": Subquery(
            AuditEvent.objects.filter(occurrence=OuterRef("pk")).order_by("-id").values("id")[:1]
        ),
        "fresh_approval_state": Subquery(current_approval.values("state")[:1]),
        "fresh_approval_expires_at": Subquery(current_approval.values("expires_at")[:1]),
        "fresh_command_state": Subquery(
            Command.objects.filter(
                approval__occurrence=OuterRef("pk"), approval__proposal__is_current=True
            )
            .order_by()
            .values("state")[:1]
        ),
        # Who can still approve is listed while the request is open.
        "fresh_reviewers": Subquery(reviewers.annotate(n=Count("pk")).values("n")),
        "fresh_last_reviewer": Subquery(reviewers.annotate(last=Max("pk")).values("last")),
        "fresh_quorum": F("tool__approvals_required"),
        "fresh_quorum_threshold": F("tool__quorum_threshold_minor"),
    }


@dataclass(frozen=True)
class Freshness:
    """An occurrence's state as far as an open review page must notice it changing."""

    tenant_id: int
    status: str
    updated_at: datetime
    last_event_id: int | None
    approval_state: str | None
    approval_expires_at: datetime | None
    command_state: str | None
    reviewers: tuple[int | None, int | None]  # how many, and the newest membership
    quorum: tuple[int, int | None]  # the contract's approvals required and threshold

    @classmethod
    def of(cls, occurrence: Occurrence) -> Freshness:
        """From an occurrence read with ``_freshness_annotations``."""
        annotated: Any = occurrence
        return cls(
            tenant_id=occurrence.tenant_id,
            status=occurrence.status,
            updated_at=occurrence.updated_at,
            last_event_id=annotated.fresh_event_id,
            approval_state=annotated.fresh_approval_state,
            approval_expires_at=annotated.fresh_approval_expires_at,
            command_state=annotated.fresh_command_state,
            reviewers=(annotated.fresh_reviewers, annotated.fresh_last_reviewer),
            quorum=(annotated.fresh_quorum, annotated.fresh_quorum_threshold),
        )


@functools.cache
def _freshness_queryset() -> QuerySet[Occurrence]:
    return Occurrence.objects.only("tenant_id", "status", "updated_at").annotate(
        **_freshness_annotations()
    )


# The freshness annotations in SQL, of the occurrence ``o`` and its tool ``t``, in
# ``Freshness`` order: the same subqueries ``_freshness_annotations`` builds (a count of
# nothing is NULL there too: the grouped subquery returns no row).
_FRESHNESS_SQL = """
    (SELECT e.id FROM approvals_auditevent e
      WHERE e.occurrence_id = o.id ORDER BY e.id DESC LIMIT 1),
    (SELECT a.state FROM approvals_approval a
       JOIN approvals_proposal p ON p.id = a.proposal_id
      WHERE a.occurrence_id = o.id AND p.is_current LIMIT 1),
    (SELECT a.expires_at FROM approvals_approval a
       JOIN approvals_proposal p ON p.id = a.proposal_id
      WHERE a.occurrence_id = o.id AND p.is_current LIMIT 1),
    (SELECT c.state FROM approvals_command c
       JOIN approvals_approval a ON a.id = c.approval_id
       JOIN approvals_proposal p ON p.id = a.proposal_id
      WHERE a.occurrence_id = o.id AND p.is_current LIMIT 1),
    (SELECT COUNT(m.id) FROM approvals_membership m
      WHERE m.tenant_id = o.tenant_id AND m.role = %s GROUP BY m.tenant_id),
    (SELECT MAX(m.id) FROM approvals_membership m
      WHERE m.tenant_id = o.tenant_id AND m.role = %s GROUP BY m.tenant_id),
    t.approvals_required,
    t.quorum_threshold_minor"""
_FRESHNESS_PARAMS = (Membership.Role.REVIEWER.value, Membership.Role.REVIEWER.value)
_FRESHNESS_COLUMNS = 8

_FRESHNESS_READ = f"""
SELECT o.tenant_id, o.status, o.updated_at, {_FRESHNESS_SQL}
  FROM approvals_occurrence o
  JOIN approvals_toolcontract t ON t.id = o.tool_id
 WHERE o.id = %s AND o.tenant_id = ANY(%s)
 LIMIT 1"""  # noqa: S608 (no input in the text)


def freshness_get(*, occurrence_id: uuid.UUID, tenant_ids: Iterable[int]) -> Freshness | None:
    """An occurrence's freshness in one query, if it belongs to one of ``tenant_ids``."""
    tenant_ids = list(tenant_ids)
    if not tenant_ids:
        return None
    if on_postgresql():
        rows = fetch(_FRESHNESS_READ, (*_FRESHNESS_PARAMS, occurrence_id, tenant_ids))
        return Freshness(*rows[0][:3], *_fresh_values(rows[0][3:])) if rows else None
    found = _freshness_queryset().filter(pk=occurrence_id, tenant_id__in=tenant_ids).first()
    return Freshness.of(found) if found else None


def _fresh_values(values: Sequence[Any]) -> tuple[Any, ...]:
    """``Freshness``'s fields after the occurrence's own, from the freshness columns."""
    event, state, expires_at, command, reviewers, last, quorum, threshold = values
    return (event, state, expires_at, command, (reviewers, last), (quorum, threshold))


def review_queryset() -> QuerySet[Occurrence]:
    """The ORM twin of ``review_get``: an occurrence with everything its review page
    shows, in a fixed number of queries (what SQLite runs, and what the tests hold the
    SQL reads equal to)."""
    return _review_queryset().all()


def _review_base() -> QuerySet[Occurrence]:
    """The occurrence with its tool, tenant and runtime key, its freshness and how many
    audit events it has."""
    return Occurrence.objects.select_related("tool", "tenant", "runtime_key").annotate(
        **_freshness_annotations(),
        history_total=Subquery(
            AuditEvent.objects.filter(occurrence=OuterRef("pk"))
            .order_by()
            .values("occurrence")
            .annotate(n=Count("id"))
            .values("n")
        ),
    )


def _review_proposals() -> QuerySet[Proposal]:
    return Proposal.objects.select_related("edited_by").order_by("version")


def _review_votes() -> QuerySet[ApprovalVote]:
    return ApprovalVote.objects.select_related("reviewer")


def _review_approvals() -> QuerySet[Approval]:
    # Each approval with its command (one-to-one), in the same query.
    return Approval.objects.select_related("approver", "command").order_by("pk")


@functools.cache
def _review_queryset() -> QuerySet[Occurrence]:
    return _review_base().prefetch_related(
        Prefetch(
            "proposals",
            queryset=_review_proposals().prefetch_related(
                Prefetch("votes", queryset=_review_votes())
            ),
        ),
        Prefetch("approvals", queryset=_review_approvals()),
    )


@dataclass(frozen=True)
class Reviewed:
    """An occurrence as its review page reads it, at one moment: the occurrence (with its
    tool, tenant and runtime key), every version in order (each one's votes in
    ``votes``), every approval (each one's command, if claimed, in ``commands``), its
    freshness, and how many audit events it has."""

    occurrence: Occurrence
    proposals: list[Proposal]
    votes: dict[int, list[ApprovalVote]]
    approvals: list[Approval]
    commands: dict[int, Command]
    freshness: Freshness
    history_total: int

    @property
    def current_proposal(self) -> Proposal:
        return next(p for p in self.proposals if p.is_current)

    @property
    def current_approval(self) -> Approval | None:
        current = self.current_proposal
        return next((a for a in self.approvals if a.proposal_id == current.pk), None)


_OCCURRENCE = Columns(Occurrence, "o")
_TOOL = Columns(ToolContract, "t")
_TENANT = Columns(Tenant, "n")
_KEY = Columns(RuntimeKey, "k")
_PROPOSAL = Columns(Proposal, "p")
_VOTE = Columns(ApprovalVote, "v")
_APPROVAL = Columns(Approval, "a")
_COMMAND = Columns(Command, "c")
_USER = Columns(get_user_model(), "u")

_REVIEW_READ = f"""
SELECT {_OCCURRENCE.sql}, {_TOOL.sql}, {_TENANT.sql}, {_KEY.sql}, {_FRESHNESS_SQL},
       (SELECT COUNT(e.id) FROM approvals_auditevent e
         WHERE e.occurrence_id = o.id GROUP BY e.occurrence_id) AS history_total
  FROM approvals_occurrence o
  JOIN approvals_toolcontract t ON t.id = o.tool_id
  JOIN approvals_tenant n ON n.id = o.tenant_id
  LEFT JOIN approvals_runtimekey k ON k.id = o.runtime_key_id
 WHERE o.id = %s AND o.tenant_id = ANY(%s)
 LIMIT 1"""  # noqa: S608 (no input in the text)

_REVIEW_PROPOSALS = f"""
SELECT {_PROPOSAL.sql}, {_USER.sql}
  FROM approvals_proposal p
  LEFT JOIN auth_user u ON u.id = p.edited_by_id
 WHERE p.occurrence_id = %s
 ORDER BY p.version"""  # noqa: S608

_REVIEW_VOTES = f"""
SELECT {_VOTE.sql}, {_USER.sql}
  FROM approvals_approvalvote v
  JOIN approvals_proposal p ON p.id = v.proposal_id
  JOIN auth_user u ON u.id = v.reviewer_id
 WHERE p.occurrence_id = %s
 ORDER BY v.created_at, v.id"""  # noqa: S608

_REVIEW_APPROVALS = f"""
SELECT {_APPROVAL.sql}, {_USER.sql}, {_COMMAND.sql}
  FROM approvals_approval a
  JOIN auth_user u ON u.id = a.approver_id
  LEFT JOIN approvals_command c ON c.approval_id = a.id
 WHERE a.occurrence_id = %s
 ORDER BY a.id"""  # noqa: S608


def review_get(*, occurrence_id: uuid.UUID, tenant_ids: Iterable[int]) -> Reviewed | None:
    """The occurrence as its review page reads it, if it belongs to one of ``tenant_ids``
    (None hides it otherwise): four statements, whatever its history."""
    tenant_ids = list(tenant_ids)
    if not tenant_ids:
        return None
    if not on_postgresql():
        return _reviewed_of(
            review_queryset().filter(pk=occurrence_id, tenant_id__in=tenant_ids).first()
        )
    rows = fetch(_REVIEW_READ, (*_FRESHNESS_PARAMS, occurrence_id, tenant_ids))
    if not rows:
        return None
    occurrence, tool, tenant, key, *rest = split(
        rows[0], _OCCURRENCE, _TOOL, _TENANT, _KEY, _FRESHNESS_COLUMNS + 1
    )
    occurrence.tool, occurrence.tenant, occurrence.runtime_key = tool, tenant, key
    proposals = []
    for row in fetch(_REVIEW_PROPOSALS, [occurrence.pk]):
        proposal, proposal.edited_by = split(row, _PROPOSAL, _USER)
        proposals.append(proposal)
    votes: dict[int, list[ApprovalVote]] = {p.pk: [] for p in proposals}
    for row in fetch(_REVIEW_VOTES, [occurrence.pk]):
        vote, vote.reviewer = split(row, _VOTE, _USER)
        votes[vote.proposal_id].append(vote)
    approvals, commands = [], {}
    for row in fetch(_REVIEW_APPROVALS, [occurrence.pk]):
        approval, approval.approver, command = split(row, _APPROVAL, _USER, _COMMAND)
        approvals.append(approval)
        if command is not None:
            commands[approval.pk] = command
    freshness = Freshness(
        occurrence.tenant_id, occurrence.status, occurrence.updated_at, *_fresh_values(rest[:-1])
    )
    return Reviewed(occurrence, proposals, votes, approvals, commands, freshness, rest[-1] or 0)


def _reviewed_of(occurrence: Occurrence | None) -> Reviewed | None:
    """``Reviewed`` from an occurrence read with ``review_queryset`` (the ORM twin)."""
    if occurrence is None:
        return None
    proposals = list(occurrence.proposals.all())
    approvals = list(occurrence.approvals.all())
    annotated: Any = occurrence
    return Reviewed(
        occurrence=occurrence,
        proposals=proposals,
        votes={p.pk: list(p.votes.all()) for p in proposals},
        approvals=approvals,
        commands={a.pk: a.command for a in approvals if hasattr(a, "command")},
        freshness=Freshness.of(occurrence),
        history_total=annotated.history_total or 0,
    )


# An effect an operator can still act on (rejected: a retry; unknown: reconciliation)
# keeps the panel polling.
_COMMAND_SETTLED = {Command.State.COMMITTED, Command.State.RECONCILED, Command.State.COMPENSATED}


@dataclass(frozen=True)
class DecisionView:
    """The decision state of an occurrence's current version, derived from stored rows."""

    state: PanelState
    proposal: Proposal
    votes: list[ApprovalVote]
    needed: int
    approval: Approval | None
    command: Command | None

    @property
    def final(self) -> bool:
        """Nothing a person or runtime does can change what the panel shows any more."""
        if self.state == PanelState.CONSUMED:
            return self.command is None or self.command.state in _COMMAND_SETTLED
        return self.state in {
            PanelState.REJECTED,
            PanelState.REVOKED,
            PanelState.EXPIRED,
            PanelState.AUTO_ADMITTED,
            PanelState.TIMED_OUT,
        }

    @property
    def voters(self) -> list[str]:
        return [vote.reviewer.get_username() for vote in self.votes]


def occurrence_decision(reviewed: Reviewed, now: datetime | None = None) -> DecisionView:
    """The decision panel's state, from an occurrence read with ``review_get``."""
    now = now or timezone.now()
    occurrence = reviewed.occurrence
    proposal = reviewed.current_proposal
    votes = reviewed.votes[proposal.pk]
    needed = occurrence.tool.approvals_needed(proposal.arguments)
    approval = reviewed.current_approval
    command = reviewed.commands.get(approval.pk) if approval is not None else None

    status = occurrence.status
    final_deadline = occurrence.final_deadline_at
    if status == Occurrence.Status.TIMED_OUT or (
        # Past the final deadline nothing can decide it, before the sweep writes it down.
        status == Occurrence.Status.PENDING_REVIEW and final_deadline and final_deadline <= now
    ):
        state = PanelState.TIMED_OUT
    elif status == Occurrence.Status.REJECTED:
        state = PanelState.REJECTED
    elif status == Occurrence.Status.AUTO_ADMITTED:
        state = PanelState.AUTO_ADMITTED
    elif approval is None:
        state = PanelState.AWAITING_QUORUM if votes else PanelState.PENDING
    else:
        approval_now = approval_state(approval, now)
        if approval_now == Approval.State.ISSUED:
            state = PanelState.DELIVERED if approval.delivered_at else PanelState.ISSUED
        else:
            state = {
                Approval.State.CONSUMED: PanelState.CONSUMED,
                Approval.State.REVOKED: PanelState.REVOKED,
                Approval.State.EXPIRED: PanelState.EXPIRED,
            }[Approval.State(approval_now)]
    return DecisionView(
        state=state,
        proposal=proposal,
        votes=votes,
        needed=needed,
        approval=approval,
        command=command,
    )


@dataclass(frozen=True)
class EffectEvidence:
    """The newest effect and recovery evidence of a command, from its audit events."""

    latest: AuditEvent | None  # the newest effect.* event
    # The newest authentication challenge, unless a later epoch was admitted after it.
    interruption: AuditEvent | None
    invocations: int  # adapter calls recorded so far
    epoch: int  # the newest epoch's number


# The newest effect, recovery and epoch events of a command that its effect line reads.
EFFECT_EVENTS = 20


def effect_evidence(
    occurrence: Occurrence, command: Command, *, history: Iterable[AuditEvent] | None = None
) -> EffectEvidence:
    """One query: the newest few effect, recovery and epoch events of the command; none
    when ``history`` holds every event of the occurrence (the page read them already)."""
    if history is not None:
        events = sorted(
            (
                e
                for e in history
                if e.command_id == command.pk and e.kind in vocabulary.EFFECT_KINDS
            ),
            key=_pk,
            reverse=True,
        )[:EFFECT_EVENTS]
    elif on_postgresql():
        events = [_EVENT.load(row) for row in fetch(_EFFECT_EVENTS, (occurrence.pk, command.pk))]
    else:
        events = list(_effect_events_queryset(occurrence.pk, command.pk))
    return _effect_evidence_of(events)


def _effect_events_queryset(
    occurrence_id: uuid.UUID, command_id: uuid.UUID
) -> QuerySet[AuditEvent]:
    """The ORM twin of ``_EFFECT_EVENTS``."""
    return AuditEvent.objects.filter(
        occurrence_id=occurrence_id, command_id=command_id, kind__in=vocabulary.EFFECT_KINDS
    ).order_by("-id")[:EFFECT_EVENTS]


_EVENT = Columns(AuditEvent, "e")
# The kinds are in the statement's text: the partial index audit_command_effects serves a
# prepared statement's generic plan only if its text implies the index's condition.
_EFFECT_EVENTS = f"""
SELECT {_EVENT.sql}
  FROM approvals_auditevent e
 WHERE e.occurrence_id = %s AND e.command_id = %s
   AND e.kind IN ({words(vocabulary.EFFECT_KINDS)})
 ORDER BY e.id DESC
 LIMIT {EFFECT_EVENTS}"""  # noqa: S608 (the console's own words, no input)


def _effect_evidence_of(events: list[AuditEvent]) -> EffectEvidence:
    """From the command's effect events, newest first."""
    latest = next((e for e in events if e.kind.startswith(vocabulary.EFFECT_PREFIX)), None)
    interruption = None
    for event in events:
        if event.kind == AuditKind.EPOCH_ADMITTED:
            break
        if event.kind == AuditKind.RECOVERY_INTERRUPTED:
            interruption = event
            break
    invocations = max(
        (e.data.get("invocation", 0) for e in events if isinstance(e.data, dict)), default=0
    )
    epoch = max(
        (e.data.get("epoch", 1) for e in events if e.kind == AuditKind.EPOCH_ADMITTED), default=1
    )
    return EffectEvidence(latest, interruption, int(invocations or 0), int(epoch))


@dataclass(frozen=True)
class ReviewSnapshot:
    """What a review page reads about one occurrence, at one moment."""

    reviewed: Reviewed
    decision: DecisionView
    # One window of the history (the newest by default), oldest first, and where it lies.
    history: HistoryWindow
    rejected_by: str
    # Counted over every claim event, read once the approval is consumed.
    claims: ClaimTally | None
    # Reviewers of the tenant, read only while the decision is still open.
    reviewer_names: list[str]
    now: datetime
    # What the outside world did with the command, read once there is one.
    effect: EffectEvidence | None = None

    @property
    def occurrence(self) -> Occurrence:
        return self.reviewed.occurrence

    @property
    def freshness(self) -> Freshness:
        return self.reviewed.freshness


def review_snapshot(
    reviewed: Reviewed,
    now: datetime | None = None,
    *,
    cursor: HistoryCursor = NEWEST,
) -> ReviewSnapshot:
    """The decision, one window of the audit events (the newest unless ``cursor`` names
    another) and, while undecided, who could still approve: a fixed number of queries on
    top of ``review_get``, however long the history."""
    now = now or timezone.now()
    occurrence = reviewed.occurrence
    decision = occurrence_decision(reviewed, now)
    undecided = decision.state in {PanelState.PENDING, PanelState.AWAITING_QUORUM}
    history = occurrence_history(occurrence, cursor, total=reviewed.history_total)
    rejector = ""
    if decision.state == PanelState.REJECTED:
        shown = reversed(history.events)
        rejector = next((e.actor for e in shown if e.kind == AuditKind.OCCURRENCE_REJECTED), "")
        if not rejector and history.total > len(history.events):
            rejector = rejected_by(occurrence)
    # A history that fits in its window is on the page whole: its claims and its effect
    # line are counted from the events read, not asked for again.
    whole = history.events if history.earlier == 0 and history.latest else None
    claims = None
    if decision.state == PanelState.CONSUMED:
        claims = (
            claim_tally_of_events(whole)
            if whole is not None
            else claim_tally_of_history(
                occurrence,
                events=reviewed.history_total,
                last_event_id=reviewed.freshness.last_event_id,
            )
        )
    return ReviewSnapshot(
        reviewed=reviewed,
        decision=decision,
        history=history,
        rejected_by=rejector,
        claims=claims,
        reviewer_names=tenant_reviewer_names(occurrence.tenant_id) if undecided else [],
        now=now,
        effect=(
            effect_evidence(occurrence, decision.command, history=whole)
            if decision.command
            else None
        ),
    )
