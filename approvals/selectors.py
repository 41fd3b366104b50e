"""Reads."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import (
    Case,
    Count,
    F,
    Max,
    Min,
    OuterRef,
    Prefetch,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.utils import timezone

from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Command,
    Epoch,
    Membership,
    Occurrence,
    Proposal,
    Tenant,
    ToolContract,
)


def parse_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def effective_approval_state(state: str, expires_at: datetime | None, now: datetime) -> str:
    """The state a person or runtime should see: an issued approval past its expiry is
    expired even before anything writes that down (``now == expires_at`` is expired)."""
    if state == Approval.State.ISSUED and expires_at is not None and expires_at <= now:
        return Approval.State.EXPIRED
    return state


def approval_state(approval: Approval, now: datetime | None = None) -> str:
    return effective_approval_state(approval.state, approval.expires_at, now or timezone.now())


def occurrence_detail_queryset() -> QuerySet[Occurrence]:
    return Occurrence.objects.select_related("tool", "tenant").prefetch_related(
        Prefetch("proposals", queryset=Proposal.objects.order_by("version")),
        Prefetch("approvals", queryset=Approval.objects.select_related("approver", "proposal")),
        Prefetch("commands", queryset=Command.objects.order_by("created_at")),
        Prefetch("epochs", queryset=Epoch.objects.order_by("number")),
    )


def occurrence_get_for_tenant(*, tenant: Tenant, occurrence_id: str) -> Occurrence | None:
    pk = parse_uuid(occurrence_id)
    if pk is None:
        return None
    return occurrence_detail_queryset().filter(tenant=tenant, pk=pk).first()


def current_proposal(occurrence: Occurrence) -> Proposal:
    """The current version, from the prefetched proposals."""
    return next(p for p in occurrence.proposals.all() if p.is_current)


def current_approval(occurrence: Occurrence) -> Approval | None:
    """The approval of the current version, from the prefetched approvals."""
    proposal = current_proposal(occurrence)
    return next((a for a in occurrence.approvals.all() if a.proposal_id == proposal.pk), None)


def audit_events_after(*, tenant: Tenant, after: int = 0) -> Iterator[AuditEvent]:
    return (
        AuditEvent.objects.filter(tenant=tenant, id__gt=after)
        .order_by("id")
        .iterator(chunk_size=500)
    )


# --- the reviewer console ---------------------------------------------------------------

# Roles that may open the console: reviewers decide, admins revoke.
CONSOLE_ROLES = (Membership.Role.REVIEWER, Membership.Role.ADMIN)


class ConsoleAccess:
    """A user's console roles by tenant, read once per request."""

    def __init__(self, memberships: list[Membership]) -> None:
        self.roles: dict[int, set[str]] = {}
        self.tenants: list[Tenant] = []
        for membership in memberships:
            if membership.tenant_id not in self.roles:
                self.roles[membership.tenant_id] = set()
                self.tenants.append(membership.tenant)
            self.roles[membership.tenant_id].add(membership.role)

    @property
    def tenant_ids(self) -> list[int]:
        return list(self.roles)

    def is_reviewer(self, tenant_id: int) -> bool:
        return Membership.Role.REVIEWER in self.roles.get(tenant_id, set())

    def is_admin(self, tenant_id: int) -> bool:
        return Membership.Role.ADMIN in self.roles.get(tenant_id, set())


def console_access(user: Any) -> ConsoleAccess:
    return ConsoleAccess(console_memberships(user))


def console_memberships(user: Any) -> list[Membership]:
    """The user's reviewer and admin memberships with their tenants, in one query."""
    if not user.is_authenticated:
        return []
    return list(
        Membership.objects.filter(user_id=user.pk, role__in=CONSOLE_ROLES)
        .select_related("tenant")
        .order_by("tenant__name", "tenant__slug", "role")
    )


def tool_ids() -> dict[str, int]:
    """Tool contract ids by name, in name order: the inbox's tool filter."""
    return dict(ToolContract.objects.order_by("name").values_list("name", "id"))


def inbox_occurrences(
    *, tenant_ids: Iterable[int], tool_id: int | None = None, status: str = ""
) -> QuerySet[Occurrence]:
    """Occurrences of the given tenants, newest first, with what an inbox row shows.

    The current proposal (with its number of votes) and its approval are prefetched into
    ``current_proposals`` and ``current_approvals`` so a page of rows costs the same few
    queries however long it is. The tool is filtered by id, so that the count runs on
    the (tenant, tool, status, created_at) index without a join.
    """
    queryset = (
        Occurrence.objects.filter(tenant_id__in=list(tenant_ids))
        .select_related("tool", "tenant")
        .prefetch_related(
            Prefetch(
                "proposals",
                queryset=Proposal.objects.filter(is_current=True).annotate(
                    votes_count=Count("votes")
                ),
                to_attr="current_proposals",
            ),
            Prefetch(
                "approvals",
                queryset=Approval.objects.filter(proposal__is_current=True),
                to_attr="current_approvals",
            ),
        )
        .order_by("-created_at", "-pk")
    )
    if tool_id is not None:
        queryset = queryset.filter(tool_id=tool_id)
    if status:
        queryset = queryset.filter(status=status)
    return queryset


@dataclass(frozen=True)
class InboxFreshness:
    """What an inbox page's poll compares, read without loading the page's rows."""

    total: int
    # A row entering the filtered list had its updated_at set when it entered, so a list
    # that gained one row and lost another still shows a change here.
    last_change: datetime | None
    # The newest audit event of the rows on the page: votes and token deliveries change
    # a row's badge without touching its occurrence.
    last_event_id: int | None


def inbox_total(occurrences: QuerySet[Occurrence]) -> tuple[int, datetime | None]:
    """How many occurrences the inbox lists, and when the newest change among them was."""
    summary = occurrences.order_by().aggregate(total=Count("pk"), last_change=Max("updated_at"))
    return summary["total"], summary["last_change"]


def inbox_last_event(occurrences: QuerySet[Occurrence], *, offset: int, limit: int) -> int | None:
    """The newest audit event of the occurrences on one page of the inbox."""
    page = occurrences.values("pk")[offset : offset + limit]
    last: int | None = AuditEvent.objects.filter(occurrence_id__in=page).aggregate(last=Max("id"))[
        "last"
    ]
    return last


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


def freshness_get(*, occurrence_id: uuid.UUID, tenant_ids: Iterable[int]) -> Freshness | None:
    """An occurrence's freshness in one query, if it belongs to one of ``tenant_ids``."""
    occurrence = (
        Occurrence.objects.filter(pk=occurrence_id, tenant_id__in=list(tenant_ids))
        .only("tenant_id", "status", "updated_at")
        .annotate(**_freshness_annotations())
        .first()
    )
    return None if occurrence is None else Freshness.of(occurrence)


def review_queryset() -> QuerySet[Occurrence]:
    """An occurrence with everything its review page shows, in a fixed number of queries.

    Its freshness and the number of its audit events are read with the occurrence itself,
    in one statement, so that a page never claims to be newer than what it shows.
    """
    return (
        Occurrence.objects.select_related("tool", "tenant", "runtime_key")
        .annotate(
            **_freshness_annotations(),
            history_total=Subquery(
                AuditEvent.objects.filter(occurrence=OuterRef("pk"))
                .order_by()
                .values("occurrence")
                .annotate(n=Count("id"))
                .values("n")
            ),
        )
        .prefetch_related(
            Prefetch(
                "proposals",
                queryset=Proposal.objects.select_related("edited_by")
                .prefetch_related(
                    Prefetch("votes", queryset=ApprovalVote.objects.select_related("reviewer"))
                )
                .order_by("version"),
            ),
            Prefetch("approvals", queryset=Approval.objects.select_related("approver")),
            Prefetch("commands", queryset=Command.objects.order_by("created_at")),
        )
    )


def review_get(*, occurrence_id: uuid.UUID, tenant_ids: Iterable[int]) -> Occurrence | None:
    """The occurrence if it belongs to one of ``tenant_ids``; None hides it otherwise."""
    return review_queryset().filter(pk=occurrence_id, tenant_id__in=list(tenant_ids)).first()


# A page shows the newest events; an occurrence whose token a runtime keeps replaying can
# have thousands. The audit API (/api/v1/audit/events) serves all of them.
HISTORY_LIMIT = 200


def occurrence_history(occurrence: Occurrence, limit: int = HISTORY_LIMIT) -> list[AuditEvent]:
    """The newest ``limit`` audit events of the occurrence, oldest first."""
    newest = list(AuditEvent.objects.filter(occurrence=occurrence).order_by("-id")[:limit])
    newest.reverse()
    return newest


def rejected_by(occurrence: Occurrence) -> str:
    """Who rejected the occurrence, from its last rejection event."""
    actor: str | None = (
        AuditEvent.objects.filter(occurrence=occurrence, kind="occurrence.rejected")
        .order_by("-id")
        .values_list("actor", flat=True)
        .first()
    )
    return actor or ""


# How many executions the evidence line names; it counts the others.
EVIDENCE_NAMES = 10
# Claims that handed out the command: the first one, and redeliveries to the same execution.
DELIVERED = ("approved", "duplicate_delivery")


@dataclass(frozen=True)
class ClaimTally:
    """An occurrence's claim events, counted over all of them, however many there are."""

    # Claims by decision, in the order each decision first occurred.
    by_decision: dict[str, int]
    commands: int  # distinct commands of approved claims
    # Approved and redelivered claims per execution, first seen first.
    deliveries: list[tuple[str, int]]
    # Executions whose claims were refused as replays, first seen first (the first few),
    # and how many there are.
    replayers: list[str]
    replayer_total: int


def claim_tally(occurrence: Occurrence) -> ClaimTally:
    """The occurrence's claim events counted in one grouped query (and the first few
    replaying executions named in a second one, if there were replays).

    Approved and redelivered claims are grouped by execution too: there are at most as
    many of those executions as the occurrence has approvals. Refusals are not, since a
    runtime can present a token under any number of execution ids."""
    claims = AuditEvent.objects.filter(occurrence=occurrence, kind__startswith="claim.").order_by()
    groups = (
        claims.values(
            "decision",
            delivered_to=Case(
                When(decision__in=DELIVERED, then=F("execution_id")), default=Value("")
            ),
        )
        .annotate(
            n=Count("id"),
            commands=Count("command_id", distinct=True),
            executions=Count("execution_id", distinct=True),
            first=Min("id"),
        )
        .order_by("first")
    )
    by_decision: dict[str, int] = {}
    deliveries: dict[str, int] = {}
    commands = replayer_total = 0
    for group in groups:
        decision = group["decision"]
        by_decision[decision] = by_decision.get(decision, 0) + group["n"]
        if decision in DELIVERED:
            execution = group["delivered_to"]
            deliveries[execution] = deliveries.get(execution, 0) + group["n"]
        if decision == "approved":
            commands += group["commands"]
        if decision == "replayed":
            replayer_total = group["executions"]
    replayers: list[str] = []
    if replayer_total:
        replayers = list(
            claims.filter(decision="replayed")
            .values("execution_id")
            .annotate(first=Min("id"))
            .order_by("first")
            .values_list("execution_id", flat=True)[:EVIDENCE_NAMES]
        )
    return ClaimTally(
        by_decision=by_decision,
        commands=commands,
        deliveries=list(deliveries.items())[:EVIDENCE_NAMES],
        replayers=replayers,
        replayer_total=replayer_total,
    )


def tenant_reviewer_names(tenant_id: int) -> list[str]:
    return list(
        Membership.objects.filter(tenant_id=tenant_id, role=Membership.Role.REVIEWER)
        .order_by("user__username")
        .values_list("user__username", flat=True)
    )


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


_COMMAND_SETTLED = {Command.State.SUCCEEDED, Command.State.FAILED, Command.State.OUTCOME_UNKNOWN}


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
    """The decision panel's state, from an occurrence loaded with ``review_queryset``."""
    now = now or timezone.now()
    proposal = current_proposal(occurrence)
    votes = list(proposal.votes.all())
    needed = occurrence.tool.approvals_needed(proposal.arguments)
    approval = current_approval(occurrence)
    command = None
    if approval is not None:
        command = next((c for c in occurrence.commands.all() if c.approval_id == approval.pk), None)

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
class ReviewSnapshot:
    """What a review page reads about one occurrence, at one moment."""

    occurrence: Occurrence
    decision: DecisionView
    freshness: Freshness
    # The newest HISTORY_LIMIT events, oldest first, and how many there are in all.
    history: list[AuditEvent]
    history_total: int
    rejected_by: str
    # Counted over every claim event, read once the approval is consumed.
    claims: ClaimTally | None
    # Reviewers of the tenant, read only while the decision is still open.
    reviewer_names: list[str]
    now: datetime


def review_snapshot(occurrence: Occurrence, now: datetime | None = None) -> ReviewSnapshot:
    """The decision, the newest audit events and, while undecided, who could still
    approve: a fixed number of queries on top of ``review_queryset``, however long the
    history."""
    now = now or timezone.now()
    decision = occurrence_decision(occurrence, now)
    undecided = decision.state in {PanelState.PENDING, PanelState.AWAITING_QUORUM}
    history = occurrence_history(occurrence)
    annotated: Any = occurrence
    total = max(annotated.history_total or 0, len(history))
    rejector = ""
    if decision.state == PanelState.REJECTED:
        rejector = next((e.actor for e in reversed(history) if e.kind == "occurrence.rejected"), "")
        if not rejector and total > len(history):
            rejector = rejected_by(occurrence)
    return ReviewSnapshot(
        occurrence=occurrence,
        decision=decision,
        freshness=Freshness.of(occurrence),
        history=history,
        history_total=total,
        rejected_by=rejector,
        claims=claim_tally(occurrence) if decision.state == PanelState.CONSUMED else None,
        reviewer_names=tenant_reviewer_names(occurrence.tenant_id) if undecided else [],
        now=now,
    )
