"""Reads."""

from __future__ import annotations

import functools
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
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

from approvals import vocabulary
from approvals.compiled import Compiled, Param, ParamArray, ParamList, literals, prefetched
from approvals.models import (
    Approval,
    ApprovalVote,
    AuditEvent,
    Command,
    Membership,
    Occurrence,
    Proposal,
    Tenant,
    ToolContract,
)
from approvals.reviews.selectors import approval_state, current_approval, current_proposal
from approvals.vocabulary import AuditKind, ClaimDecision

# Roles that may open the console: reviewers decide, admins revoke.
CONSOLE_ROLES = (Membership.Role.REVIEWER, Membership.Role.ADMIN)


class ConsoleAccess:
    """A user's console roles by tenant, read once per request."""

    def __init__(self, memberships: list[Membership]) -> None:
        self.roles: dict[int, set[str]] = {}
        self.tenants: list[Tenant] = []
        # Operators work in the operations console; the header links to it.
        self.operator_tenant_ids: set[int] = set()
        self.operator_tenants: list[Tenant] = []  # in name order, as the console's
        for membership in memberships:
            if membership.role == Membership.Role.OPERATOR:
                if membership.tenant_id not in self.operator_tenant_ids:
                    self.operator_tenant_ids.add(membership.tenant_id)
                    self.operator_tenants.append(membership.tenant)
                continue
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


_MEMBERSHIPS = Compiled[Membership](
    lambda: (
        Membership.objects.filter(user_id=Param("user", Membership._meta.get_field("user")))
        .select_related("tenant")
        .order_by("tenant__name", "tenant__slug", "role")
    )
)


def console_memberships(user: Any) -> list[Membership]:
    """The user's memberships with their tenants, in one query (read on every page)."""
    if not user.is_authenticated:
        return []
    return _MEMBERSHIPS.run(user=user.pk)


_TOOL_IDS = Compiled[tuple[str, int]](
    lambda: ToolContract.objects.order_by("name").values_list("name", "id")
)


_INBOX_TOOLS = Compiled[ToolContract](
    lambda: ToolContract.objects.defer("json_schema", "description").order_by("name")
)


def tool_ids() -> dict[str, int]:
    """Tool contract ids by name, in name order: the inbox's tool filter."""
    return dict(_TOOL_IDS.run())


def inbox_tools() -> dict[int, ToolContract]:
    """Every tool contract by id, in name order, without the schema and description an
    inbox row never shows: the inbox's tool filter, and the tool of each of its rows."""
    return {contract.pk: contract for contract in _INBOX_TOOLS.run()}


def tool_contracts() -> list[ToolContract]:
    """Every tool contract, in name order."""
    return list(ToolContract.objects.order_by("name"))


def tool_contract(name: str) -> ToolContract | None:
    return ToolContract.objects.filter(name=name).first()


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


@dataclass(frozen=True)
class InboxQuery:
    """Which occurrences an inbox lists: its tenants, and the tool and status it filters
    by (none: all)."""

    tenant_ids: list[int]
    tool_id: int | None = None
    status: str = ""

    def values(self) -> dict[str, Any]:
        """The compiled reads' values."""
        return {"tenant_ids": self.tenant_ids, "tool": self.tool_id, "status": self.status}

    def shape(self, **fixed: Any) -> dict[str, Any]:
        return {"by_tool": self.tool_id is not None, "by_status": bool(self.status), **fixed}


def _inbox_filtered(tenant_ids: int, by_tool: bool, by_status: bool) -> QuerySet[Occurrence]:
    """The occurrences an inbox lists, newest first, with ``Param``s for the compiled reads
    below. The tool is filtered by id, so that the count runs on the (tenant, tool, status,
    created_at) index without a join."""
    # No tenant: nothing to list, and no query (as Django answers ``__in=[]``).
    queryset = Occurrence.objects.filter(
        tenant_id__in=ParamList("tenant_ids", tenant_ids, _TENANT_PK) if tenant_ids else []
    )
    if by_tool:
        queryset = queryset.filter(tool_id=Param("tool", ToolContract._meta.pk))
    if by_status:
        queryset = queryset.filter(status=Param("status", Occurrence._meta.get_field("status")))
    return queryset.order_by("-created_at", "-pk")


def _page_ids(
    tenant_ids: int, by_tool: bool, by_status: bool, offset: int, limit: int
) -> QuerySet[Occurrence, Any]:
    """The ids of one page, from the (tenant, status, created_at, id) index alone."""
    return _inbox_filtered(tenant_ids, by_tool, by_status).values("pk")[offset : offset + limit]


# One row of aggregates over everything matched: grouped by a constant, which groups
# nothing (Django leaves a constant out of GROUP BY).
def _summary(queryset: QuerySet[Any], **aggregates: Any) -> QuerySet[Any]:
    return (
        queryset.order_by()
        .annotate(everything=Value(1))
        .values("everything")
        .annotate(**aggregates)
        .values_list(*aggregates)
    )


_INBOX_TOTAL = Compiled[tuple[int, datetime | None]](
    lambda tenant_ids, by_tool, by_status: _summary(
        _inbox_filtered(tenant_ids, by_tool, by_status),
        total=Count("pk"),
        last_change=Max("updated_at"),
    )
)


_INBOX_LAST_EVENT = Compiled[tuple[int | None]](
    lambda tenant_ids, by_tool, by_status, offset, limit: _summary(
        AuditEvent.objects.filter(
            occurrence_id__in=_page_ids(tenant_ids, by_tool, by_status, offset, limit)
        ),
        last=Max("id"),
    )
)


_INBOX_PAGE = Compiled[Occurrence](
    lambda tenant_ids, by_tool, by_status, offset, limit: _inbox_filtered(
        tenant_ids, by_tool, by_status
    ).filter(pk__in=_page_ids(tenant_ids, by_tool, by_status, offset, limit))
)


_PAGE_OCCURRENCES = ParamArray("occurrences", Occurrence._meta.pk)


_INBOX_PROPOSALS = Compiled[Proposal](
    lambda: Proposal.objects.filter(occurrence_id__in=_PAGE_OCCURRENCES, is_current=True).annotate(
        votes_count=Count("votes")
    )
)


_INBOX_APPROVALS = Compiled[Approval](
    lambda: Approval.objects.filter(occurrence_id__in=_PAGE_OCCURRENCES, proposal__is_current=True)
)


def inbox_total(query: InboxQuery) -> tuple[int, datetime | None]:
    """How many occurrences the inbox lists, and when the newest change among them was."""
    for total, last_change in _INBOX_TOTAL.run(query.shape(), **query.values()):
        return total, last_change
    return 0, None  # no tenant to list


def inbox_last_event(query: InboxQuery, *, offset: int, limit: int) -> int | None:
    """The newest audit event of the occurrences on one page of the inbox."""
    fixed = query.shape(offset=offset, limit=limit)
    for (last,) in _INBOX_LAST_EVENT.run(fixed, **query.values()):
        return last
    return None


def inbox_page(
    query: InboxQuery,
    *,
    offset: int,
    limit: int,
    tools: dict[int, ToolContract],
    tenants: Iterable[Tenant],
) -> list[Occurrence]:
    """One page of the inbox's rows, with the current proposal (with its number of votes)
    and its approval of each in ``current_proposals`` and ``current_approvals``. The page's
    ids are picked first, from the (tenant, status, created_at, id) index alone, and only
    those rows are read: a deep page skips index entries, not table rows with their joins.

    Each row's tool and tenant are the instances the page already has (``inbox_tools``,
    the reader's tenants), shared by its rows rather than built again for each one; a
    tool added since ``tools`` was read is fetched then."""
    page = _INBOX_PAGE.run(query.shape(offset=offset, limit=limit), **query.values())
    ids = [occurrence.pk for occurrence in page]
    proposals: dict[Any, list[Proposal]] = {pk: [] for pk in ids}
    approvals: dict[Any, list[Approval]] = {pk: [] for pk in ids}
    if ids:
        for proposal in _INBOX_PROPOSALS.run(occurrences=ids):
            proposals[proposal.occurrence_id].append(proposal)
        for approval in _INBOX_APPROVALS.run(occurrences=ids):
            approvals[approval.occurrence_id].append(approval)
    missing = {o.tool_id for o in page} - tools.keys()
    if missing:
        tools = {**tools, **ToolContract.objects.in_bulk(missing)}
    tenant_of = {tenant.pk: tenant for tenant in tenants}
    for occurrence in page:
        occurrence.current_proposals = proposals[occurrence.pk]  # type: ignore[attr-defined]
        occurrence.current_approvals = approvals[occurrence.pk]  # type: ignore[attr-defined]
        occurrence.tool = tools[occurrence.tool_id]
        tenant = tenant_of.get(occurrence.tenant_id)
        if tenant is not None:  # else read when shown: a page filters by the reader's tenants
            occurrence.tenant = tenant
    return page


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


# A page shows the newest events; an occurrence whose token a runtime keeps replaying can
# have thousands. The audit API (/api/v1/audit/events) serves all of them.
HISTORY_PAGE = 50


@dataclass(frozen=True)
class HistoryCursor:
    """Which window of a history a page shows: the newest (neither set), the window just
    before event ``before``, or the one just after event ``after`` (``after=0``: the
    oldest). Event ids are keyset cursors: a window is one range scan of the (occurrence,
    id) index however far back it lies, never an OFFSET."""

    before: int | None = None
    after: int | None = None

    @classmethod
    def parse(cls, before: str | None, after: str | None) -> HistoryCursor:
        """From a page's query string; anything but a non-negative integer is ignored."""

        def event_id(value: str | None) -> int | None:
            if value is None or not value.isdigit() or len(value) > 19:
                return None
            return int(value)

        before_id, after_id = event_id(before), event_id(after)
        if before_id is not None:
            return cls(before=before_id)
        return cls(after=after_id)

    @property
    def query(self) -> dict[str, str]:
        """The cursor as query parameters (none for the newest window)."""
        if self.before is not None:
            return {"before": str(self.before)}
        if self.after is not None:
            return {"after": str(self.after)}
        return {}


@dataclass(frozen=True)
class HistoryWindow:
    """Up to HISTORY_PAGE consecutive events of an occurrence, oldest first, and where
    they lie in its whole history."""

    events: list[AuditEvent]
    total: int  # events of the occurrence in all
    earlier: int  # events older than the first shown
    cursor: HistoryCursor = HistoryCursor()

    @property
    def later(self) -> int:
        """Events newer than the last shown."""
        return max(self.total - self.earlier - len(self.events), 0)

    @property
    def latest(self) -> bool:
        return self.later == 0


def occurrence_history(
    occurrence: Occurrence,
    cursor: HistoryCursor = HistoryCursor(),
    *,
    total: int = 0,
    size: int = HISTORY_PAGE,
) -> HistoryWindow:
    """One window of the occurrence's audit events: one query for the newest window, and
    at most two for any other (the window, then how many events precede it, which the
    oldest windows know without asking). ``total`` is the number of events counted with
    the occurrence (``review_get``). Windows do not overlap: the one before the
    oldest full window holds what is left, however few."""
    limit = {"limit": size}
    if cursor.before is None and cursor.after is None:
        newest = _HISTORY_NEWEST.run(limit, occurrence=occurrence.pk)
        newest.reverse()
        total = max(total, len(newest))
        return HistoryWindow(newest, total, total - len(newest))
    if cursor.before is not None:
        window = _HISTORY_BEFORE.run(limit, occurrence=occurrence.pk, id=cursor.before)
        window.reverse()
    else:
        window = _HISTORY_AFTER.run(limit, occurrence=occurrence.pk, id=cursor.after)
    if cursor.after == 0 or (cursor.before is not None and len(window) < size):
        earlier = 0  # the window starts at the first event
    elif window:
        earlier = sum(_HISTORY_EARLIER.run(occurrence=occurrence.pk, id=window[0].pk))
    else:
        earlier = total  # nothing after the cursor: every event is earlier
    return HistoryWindow(window, max(total, earlier + len(window)), earlier, cursor)


# A history's windows, compiled once per process (approvals.compiled).
_EVENT_PK = AuditEvent._meta.pk


def _events_of() -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(occurrence_id=Param("occurrence", _OCCURRENCE_PK))


_HISTORY_NEWEST = Compiled[AuditEvent](lambda limit: _events_of().order_by("-id")[:limit])


_HISTORY_BEFORE = Compiled[AuditEvent](
    lambda limit: _events_of().filter(id__lt=Param("id", _EVENT_PK)).order_by("-id")[:limit]
)


_HISTORY_AFTER = Compiled[AuditEvent](
    lambda limit: _events_of().filter(id__gt=Param("id", _EVENT_PK)).order_by("id")[:limit]
)


# How many events precede one: a row with the count (none when none do).
_HISTORY_EARLIER = Compiled[int](
    lambda: (
        _events_of()
        .filter(id__lt=Param("id", _EVENT_PK))
        .order_by()
        .values("occurrence_id")
        .annotate(n=Count("id"))
        .values_list("n", flat=True)
    )
)


def rejected_by(occurrence: Occurrence) -> str:
    """Who rejected the occurrence, from its last rejection event."""
    actors = _REJECTED_BY.run(occurrence=occurrence.pk)
    return actors[0] if actors and actors[0] else ""


_REJECTED_BY = Compiled[str](
    lambda: (
        AuditEvent.objects.filter(
            occurrence_id=Param("occurrence", Occurrence._meta.pk),
            kind=AuditKind.OCCURRENCE_REJECTED,
        )
        .order_by("-id")
        .values_list("actor", flat=True)[:1]
    )
)


# How many executions the evidence line names; it counts the others.
EVIDENCE_NAMES = 10


# Claims that handed out the command: the first one, and redeliveries to the same execution.
DELIVERED = vocabulary.ADMITTING


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
    claims = AuditEvent.objects.filter(
        occurrence=occurrence, kind__startswith=vocabulary.CLAIM_PREFIX
    ).order_by()
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
        if decision == ClaimDecision.APPROVED:
            commands += group["commands"]
        if decision == ClaimDecision.REPLAYED:
            replayer_total = group["executions"]
    replayers: list[str] = []
    if replayer_total:
        replayers = list(
            claims.filter(decision=ClaimDecision.REPLAYED)
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


def claim_tally_of_events(events: Iterable[AuditEvent]) -> ClaimTally:
    """``claim_tally`` counted in Python, for a history whose every event the page has
    read already (it fits in one window): the same numbers, without asking again."""
    claims = sorted((e for e in events if e.kind.startswith(vocabulary.CLAIM_PREFIX)), key=_pk)
    by_decision: dict[str, int] = {}
    deliveries: dict[str, int] = {}
    commands: dict[str, set[uuid.UUID]] = {}
    replayers: dict[str, None] = {}
    for claim in claims:
        decision = claim.decision
        by_decision[decision] = by_decision.get(decision, 0) + 1
        if decision in DELIVERED:
            deliveries[claim.execution_id] = deliveries.get(claim.execution_id, 0) + 1
        if decision == ClaimDecision.APPROVED:
            # Distinct commands per approved execution, summed, as the grouped query does.
            executed = commands.setdefault(claim.execution_id, set())
            if claim.command_id is not None:
                executed.add(claim.command_id)
        elif decision == ClaimDecision.REPLAYED:
            replayers.setdefault(claim.execution_id)
    return ClaimTally(
        by_decision=by_decision,
        commands=sum(len(executed) for executed in commands.values()),
        deliveries=list(deliveries.items())[:EVIDENCE_NAMES],
        replayers=list(replayers)[:EVIDENCE_NAMES],
        replayer_total=len(replayers),
    )


def _pk(event: AuditEvent) -> int:
    return event.pk


# Counting a long history's claims groups every one of them (thousands for a token a
# runtime keeps replaying). Audit events are append-only (a trigger refuses UPDATE and
# DELETE), so the events an occurrence shows only ever grow: their number names them, and
# a tally counted at that number stays right until it changes. Long histories keep their
# tally per process under (occurrence, number of events, newest event); the first page
# after a new event counts again.
TALLY_CACHE_MIN_EVENTS = 500


TALLY_CACHE_SIZE = 256


_tallies: OrderedDict[tuple[uuid.UUID, int, int | None], ClaimTally] = OrderedDict()


_tallies_lock = threading.Lock()


def claim_tally_of_history(
    occurrence: Occurrence, *, events: int, last_event_id: int | None
) -> ClaimTally:
    """``claim_tally``, remembered for a long history while its ``events`` (the number
    of the occurrence's audit events) and ``last_event_id`` stay what they were."""
    if events < TALLY_CACHE_MIN_EVENTS:
        return claim_tally(occurrence)
    key = (occurrence.pk, events, last_event_id)
    with _tallies_lock:
        tally = _tallies.get(key)
        if tally is not None:
            _tallies.move_to_end(key)
            return tally
    tally = claim_tally(occurrence)
    with _tallies_lock:
        _tallies[key] = tally
        while len(_tallies) > TALLY_CACHE_SIZE:
            _tallies.popitem(last=False)
    return tally


_TENANT_PK = Tenant._meta.pk


_REVIEWER_NAMES = Compiled[str](
    lambda: (
        Membership.objects.filter(
            tenant_id=Param("tenant", _TENANT_PK), role=Membership.Role.REVIEWER
        )
        .order_by("user__username")
        .values_list("user__username", flat=True)
    )
)


_MEMBERS = Compiled[tuple[str, str]](
    lambda: (
        Membership.objects.filter(tenant_id=Param("tenant", _TENANT_PK))
        .values_list("user__username", "user__email")
        .distinct()
    )
)


def tenant_reviewer_names(tenant_id: int) -> list[str]:
    return _REVIEWER_NAMES.run(tenant=tenant_id)


def tenant_members(tenant_id: int) -> list[tuple[str, str]]:
    """The (username, email) of everyone with a role in the tenant."""
    return _MEMBERS.run(tenant=tenant_id)


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
    cursor: HistoryCursor = HistoryCursor(),
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
