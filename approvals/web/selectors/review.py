"""The review page's reads: the occurrence with its versions, votes and approvals, what the
panel shows of it, its effect evidence, and the stamp a poll compares."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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
from approvals.compiled import Compiled, Param, ParamList, literals, prefetched
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Command,
    Membership,
    Occurrence,
    Proposal,
    Tenant,
)
from approvals.reviews.selectors import approval_state, current_approval, current_proposal
from approvals.vocabulary import AuditKind
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


def freshness_get(*, occurrence_id: uuid.UUID, tenant_ids: Iterable[int]) -> Freshness | None:
    """An occurrence's freshness in one query, if it belongs to one of ``tenant_ids``."""
    tenant_ids = list(tenant_ids)
    found = _FRESHNESS.run(pk=occurrence_id, tenant_ids=tenant_ids) if tenant_ids else []
    return Freshness.of(found[0]) if found else None


_FRESHNESS = Compiled[Occurrence](
    lambda tenant_ids: _one_of_tenants(_freshness_queryset(), tenant_ids)
)


def review_queryset() -> QuerySet[Occurrence]:
    """An occurrence with everything its review page shows, in a fixed number of queries.

    Its freshness and the number of its audit events are read with the occurrence itself,
    in one statement, so that a page never claims to be newer than what it shows. Pages
    read it through ``review_get`` (the same statements, compiled once); this queryset is
    what ``tests/approvals/test_compiled.py`` holds them equal to.
    """
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
    return Approval.objects.select_related("approver", "command")


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


def _one_of_tenants(queryset: QuerySet[Occurrence], tenant_ids: int) -> QuerySet[Occurrence]:
    """``queryset``'s occurrence ``pk`` if it belongs to one of ``tenant_ids``, as a
    compiled read's statement (``approvals.compiled``)."""
    return queryset.filter(
        pk=Param("pk", Occurrence._meta.pk),
        tenant_id__in=ParamList("tenant_ids", tenant_ids, Tenant._meta.pk),
    )[:1]


# ``review_queryset``'s four statements, compiled once per process (approvals.compiled).
_OCCURRENCE_PK = Occurrence._meta.pk


_REVIEW = Compiled[Occurrence](lambda tenant_ids: _one_of_tenants(_review_base(), tenant_ids))


_REVIEW_PROPOSALS = Compiled[Proposal](
    lambda: _review_proposals().filter(occurrence_id=Param("pk", _OCCURRENCE_PK))
)


_REVIEW_VOTES = Compiled[ApprovalVote](
    lambda: _review_votes().filter(proposal__occurrence_id=Param("pk", _OCCURRENCE_PK))
)


_REVIEW_APPROVALS = Compiled[Approval](
    lambda: _review_approvals().filter(occurrence_id=Param("pk", _OCCURRENCE_PK))
)


def review_get(*, occurrence_id: uuid.UUID, tenant_ids: Iterable[int]) -> Occurrence | None:
    """The occurrence if it belongs to one of ``tenant_ids``; None hides it otherwise.
    What ``review_queryset`` reads, in the same four statements, compiled once."""
    tenant_ids = list(tenant_ids)
    if not tenant_ids:
        return None
    found = _REVIEW.run(pk=occurrence_id, tenant_ids=tenant_ids)
    if not found:
        return None
    [occurrence] = found
    proposals = _REVIEW_PROPOSALS.run(pk=occurrence.pk)
    votes: dict[int, list[ApprovalVote]] = {p.pk: [] for p in proposals}
    for vote in _REVIEW_VOTES.run(pk=occurrence.pk):
        votes[vote.proposal_id].append(vote)
    for proposal in proposals:
        prefetched(proposal, "votes", votes[proposal.pk])
    prefetched(occurrence, "proposals", proposals)
    prefetched(occurrence, "approvals", _REVIEW_APPROVALS.run(pk=occurrence.pk))
    return occurrence


class PanelState:
    """What the decision panel shows; the values of ``DecisionView.state``."""

    PENDING = "pending"
    AWAITING_QUORUM = "awaiting_quorum"
    ISSUED = "issued"
    DELIVERED = "delivered"
    CONSUMED = "consumed"
    REJECTED = "rejected"
    REVOKED = "revoked"
    EXPIRED = "expired"
    AUTO_ADMITTED = "auto_admitted"


# An effect an operator can still act on (rejected: a retry; unknown: reconciliation)
# keeps the panel polling.
_COMMAND_SETTLED = {Command.State.COMMITTED, Command.State.RECONCILED, Command.State.COMPENSATED}


@dataclass(frozen=True)
class DecisionView:
    """The decision state of an occurrence's current version, derived from stored rows."""

    state: str
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
        }

    @property
    def voters(self) -> list[str]:
        return [vote.reviewer.get_username() for vote in self.votes]


def occurrence_decision(occurrence: Occurrence, now: datetime | None = None) -> DecisionView:
    """The decision panel's state, from an occurrence loaded with ``review_get``."""
    now = now or timezone.now()
    proposal = current_proposal(occurrence)
    votes = list(proposal.votes.all())
    needed = occurrence.tool.approvals_needed(proposal.arguments)
    approval = current_approval(occurrence)
    command = None
    if approval is not None:
        # Read with the approval (``review_get``); an approval without one raises
        # RelatedObjectDoesNotExist, an AttributeError.
        command = getattr(approval, "command", None)

    status = occurrence.status
    if status == Occurrence.Status.REJECTED:
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
    else:
        events = _EFFECT_EVENTS.run(occurrence=occurrence.pk, command=command.pk)
    return _effect_evidence_of(events)


_EFFECT_EVENTS = Compiled[AuditEvent](
    lambda: AuditEvent.objects.filter(
        occurrence_id=Param("occurrence", Occurrence._meta.pk),
        command_id=Param("command", AuditEvent._meta.get_field("command_id")),
        # audit_command_effects' condition, in the statement's text (compiled.Literal).
        kind__in=literals(vocabulary.EFFECT_KINDS),
    ).order_by("-id")[:EFFECT_EVENTS]
)


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

    occurrence: Occurrence
    decision: DecisionView
    freshness: Freshness
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


def review_snapshot(
    occurrence: Occurrence,
    now: datetime | None = None,
    *,
    cursor: HistoryCursor = NEWEST,
) -> ReviewSnapshot:
    """The decision, one window of the audit events (the newest unless ``cursor`` names
    another) and, while undecided, who could still approve: a fixed number of queries on
    top of ``review_get``, however long the history."""
    now = now or timezone.now()
    decision = occurrence_decision(occurrence, now)
    undecided = decision.state in {PanelState.PENDING, PanelState.AWAITING_QUORUM}
    annotated: Any = occurrence
    history = occurrence_history(occurrence, cursor, total=annotated.history_total or 0)
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
                events=annotated.history_total or 0,
                last_event_id=annotated.fresh_event_id,
            )
        )
    return ReviewSnapshot(
        occurrence=occurrence,
        decision=decision,
        freshness=Freshness.of(occurrence),
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
