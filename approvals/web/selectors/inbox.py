"""The inbox's reads: a page of occurrences with their current proposal and approval, and
the stamp that tells a poll whether anything changed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)

from approvals import vocabulary
from approvals.canonical.money import CURRENCIES, currency_exponent, is_amount
from approvals.models import (
    Approval,
    AuditEvent,
    Command,
    Occurrence,
    Proposal,
    ReviewerGroup,
    RoutingRuleVersion,
    Tenant,
    ToolContract,
)
from approvals.sql import Columns, fetch, on_postgresql, split, words
from approvals.vocabulary import AuditKind

# The command states that make an approval one that "went wrong" for the reviewer who gave
# it: the call failed (an interruption is a rejected call) or nobody knows what it did.
WENT_WRONG_STATES = (Command.State.REJECTED.value, Command.State.OUTCOME_UNKNOWN.value)


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
    # "My approvals that went wrong": only occurrences this user voted for whose command
    # failed, is unknown or was interrupted.
    went_wrong_for: int | None = None
    # Who asked and in which run (exact), and an amount range (``amount_in_range``).
    requested_by: str = ""
    run_id: str = ""
    amount_min: Decimal | None = None
    amount_max: Decimal | None = None

    # Routing: the pending requests a rule routes to ``reader_id`` (a rule version whose
    # groups hold them, or whose fallback group does once the request is escalated) come
    # first, badged; the rest follow, newest first. None: newest first.
    reader_id: int | None = None
    # Those rule versions, on PostgreSQL: ``inbox_total`` reads them in its statement and
    # answers with the query holding them, which the page's reads order by. (The ORM twins
    # ask the reader's groups in their own statements instead.)
    routed_versions: tuple[int, ...] = ()
    fallback_versions: tuple[int, ...] = ()

    @property
    def by_amount(self) -> bool:
        return self.amount_min is not None or self.amount_max is not None

    @property
    def routes(self) -> bool:
        """Whether the SQL reads put rows routed to the reader first: only when a rule
        routes to them, so that the plain order reads a page from the index alone."""
        return bool(self.routed_versions or self.fallback_versions)


@dataclass(frozen=True)
class InboxCount:
    """``inbox_total``'s answer: how many rows, when the newest changed, and the query with
    the rule versions that route to its reader (what the page's reads order by)."""

    total: int
    last_change: datetime | None
    query: InboxQuery


# The amount the inbox's amount range reads: the arguments' top-level ``amount_minor``,
# with their ``currency`` (integer minor units beside an ISO 4217 code, the house form of
# money), compared in that currency's major units: 500 is EUR 500.00 and JPY 500.
AMOUNT_ARGUMENT, CURRENCY_ARGUMENT = "amount_minor", "currency"


def amount_in_range(arguments: dict[str, Any], low: Decimal | None, high: Decimal | None) -> bool:
    """Whether a request's amount is within [low, high]; one without an amount in an ISO
    4217 currency is not (the ORM twin of ``_AMOUNT_SQL``)."""
    amount = arguments.get(AMOUNT_ARGUMENT)
    exponent = currency_exponent(arguments.get(CURRENCY_ARGUMENT))
    if not isinstance(amount, int) or not is_amount(AMOUNT_ARGUMENT, amount) or exponent is None:
        return False
    major = Decimal(amount) / (10**exponent)
    return (low is None or major >= low) and (high is None or major <= high)


def _factors() -> str:
    """A SQL CASE: 10 to the power of the currency ``c``'s exponent, NULL for no currency."""
    by_exponent: dict[int, list[str]] = {}
    for code, exponent in CURRENCIES.items():
        assert re.fullmatch(r"[A-Z]{3}", code)  # the ISO list's own codes, never input
        by_exponent.setdefault(exponent, []).append(f"'{code}'")
    cases = " ".join(
        f"WHEN c IN ({', '.join(sorted(codes))}) THEN {10**exponent}"
        for exponent, codes in sorted(by_exponent.items())
    )
    return f"CASE {cases} END"


# The current version's amount in major units, for the amount range: NULL (never in range)
# without an integer amount in an ISO 4217 currency.
_AMOUNT_SQL = f"""
 AND EXISTS (SELECT 1 FROM approvals_proposal p,
                LATERAL (SELECT p.canonical_action::jsonb -> 'arguments' AS args) j,
                LATERAL (SELECT j.args ->> '{CURRENCY_ARGUMENT}' AS c) k
              WHERE p.occurrence_id = o.id AND p.is_current
                AND (CASE WHEN jsonb_typeof(j.args -> '{AMOUNT_ARGUMENT}') = 'number'
                          THEN (j.args ->> '{AMOUNT_ARGUMENT}')::numeric END)
                    / ({_factors()}) BETWEEN %s AND %s)"""  # noqa: S608 (no input in the text)

# Bounds for an open end of the range, beyond any amount.
_NO_BOUND = Decimal("1e30")


def _inbox_filtered(query: InboxQuery) -> QuerySet[Occurrence]:
    """The ORM twin of the occurrences an inbox lists, newest first."""
    queryset = Occurrence.objects.filter(tenant_id__in=query.tenant_ids)
    if query.tool_id is not None:
        queryset = queryset.filter(tool_id=query.tool_id)
    if query.status:
        queryset = queryset.filter(status=query.status)
    if query.requested_by:
        queryset = queryset.filter(requested_by=query.requested_by)
    if query.run_id:
        queryset = queryset.filter(run_id=query.run_id)
    if query.by_amount:
        current = Proposal.objects.filter(occurrence__in=queryset, is_current=True)
        queryset = queryset.filter(
            pk__in=[
                pk
                for pk, canonical in current.values_list("occurrence_id", "canonical_action")
                if amount_in_range(
                    Proposal.arguments_of(canonical), query.amount_min, query.amount_max
                )
            ]
        )
    if query.went_wrong_for is not None:
        queryset = queryset.filter(
            Exists(
                Command.objects.filter(
                    occurrence_id=OuterRef("pk"),
                    state__in=WENT_WRONG_STATES,
                    approval__proposal__votes__reviewer_id=query.went_wrong_for,
                )
            )
        )
    if query.reader_id is not None:
        version = RoutingRuleVersion.objects.filter(pk=OuterRef("routed_by_id"))
        mine = version.filter(groups__members__pk=query.reader_id)
        fallback = version.filter(fallback_group__members__pk=query.reader_id)
        routed = Q(status=Occurrence.Status.PENDING_REVIEW) & (
            Exists(mine) | Q(escalated_at__isnull=False) & Exists(fallback)
        )
        queryset = queryset.annotate(
            routed_first=Case(When(routed, then=Value(True)), default=Value(False))
        )
        return queryset.order_by("-routed_first", "-created_at", "-pk")
    return queryset.order_by("-created_at", "-pk")


def _routed(query: InboxQuery) -> tuple[str, list[Any]]:
    """Whether the row ``o`` is routed to the reader, as SQL, and its values. Never NULL:
    a request no rule routed (``routed_by_id`` NULL) would otherwise sort first, NULLs
    being first in a descending order."""
    if not query.routes:
        return "FALSE", []
    sql = (
        f"COALESCE(o.status = '{Occurrence.Status.PENDING_REVIEW.value}'"
        " AND (o.routed_by_id = ANY(%s)"
        " OR (o.escalated_at IS NOT NULL AND o.routed_by_id = ANY(%s))), FALSE)"
    )
    return sql, [list(query.routed_versions), list(query.fallback_versions)]


def _order(query: InboxQuery) -> tuple[str, list[Any]]:
    """The inbox's order: what is routed to the reader first (only when something is: the
    plain order reads the page from the index alone), then newest first."""
    if not query.routes:
        return "o.created_at DESC, o.id DESC", []
    routed, params = _routed(query)
    return f"{routed} DESC, o.created_at DESC, o.id DESC", params


def _where(query: InboxQuery) -> tuple[str, list[Any]]:
    """The condition an inbox's occurrences ``o`` meet, and its values. The tool is
    matched by id, so that the count runs on the (tenant, tool, status, created_at) index
    without a join."""
    sql = "o.tenant_id = ANY(%s)"
    params: list[Any] = [query.tenant_ids]
    if query.tool_id is not None:
        sql, params = sql + " AND o.tool_id = %s", [*params, query.tool_id]
    if query.status:
        sql, params = sql + " AND o.status = %s", [*params, query.status]
    if query.requested_by:
        sql, params = sql + " AND o.requested_by = %s", [*params, query.requested_by]
    if query.run_id:
        sql, params = sql + " AND o.run_id = %s", [*params, query.run_id]
    if query.by_amount:
        low = -_NO_BOUND if query.amount_min is None else query.amount_min
        high = _NO_BOUND if query.amount_max is None else query.amount_max
        sql, params = sql + _AMOUNT_SQL, [*params, low, high]
    if query.went_wrong_for is not None:
        sql, params = sql + _WENT_WRONG, [*params, query.went_wrong_for]
    return sql, params


# The occurrence has a command whose approval the user voted for, and the command failed
# or its outcome is unknown (an interruption is a rejected call).
_WENT_WRONG = f"""
 AND EXISTS (SELECT 1 FROM approvals_command c
               JOIN approvals_approval a ON a.id = c.approval_id
               JOIN approvals_approvalvote v ON v.proposal_id = a.proposal_id
              WHERE c.occurrence_id = o.id AND v.reviewer_id = %s
                AND c.state IN ({words(WENT_WRONG_STATES)}))"""  # noqa: S608 (no input)


def _page_ids(where: str, order: str = "o.created_at DESC, o.id DESC") -> str:
    """The ids of one page (``LIMIT %s OFFSET %s``), from the (tenant, status, created_at,
    id) index alone (in the plain order)."""
    return f"""SELECT o.id FROM approvals_occurrence o WHERE {where}
                ORDER BY {order} LIMIT %s OFFSET %s"""  # noqa: S608


_VERSION_GROUPS = RoutingRuleVersion.groups.through._meta.db_table
_GROUP_MEMBERS = ReviewerGroup.members.through._meta.db_table

# The rule versions whose groups hold the reader, and those whose fallback group does: two
# arrays beside the count, in its statement (uncorrelated: each is read once).
_ROUTED_TO_READER = f"""
       ARRAY(SELECT DISTINCT vg.routingruleversion_id FROM {_VERSION_GROUPS} vg
               JOIN {_GROUP_MEMBERS} gm ON gm.reviewergroup_id = vg.reviewergroup_id
              WHERE gm.user_id = %s ORDER BY 1),
       ARRAY(SELECT v.id FROM approvals_routingruleversion v
               JOIN {_GROUP_MEMBERS} gm ON gm.reviewergroup_id = v.fallback_group_id
              WHERE gm.user_id = %s ORDER BY 1)"""  # noqa: S608 (no input in the text)


def inbox_total(query: InboxQuery) -> InboxCount:
    """How many occurrences the inbox lists, when the newest change among them was, and
    (in the same statement) the rule versions that route to the query's reader."""
    if not query.tenant_ids:
        return InboxCount(0, None, query)  # no tenant to list
    if not on_postgresql():
        found = _inbox_filtered(query).aggregate(total=Count("pk"), last=Max("updated_at"))
        return InboxCount(found["total"], found["last"], query)
    where, params = _where(query)
    routing, routing_params = (
        ("", [])
        if query.reader_id is None
        else (
            f",{_ROUTED_TO_READER}",
            [query.reader_id, query.reader_id],
        )
    )
    sql = f"""SELECT COUNT(o.id), MAX(o.updated_at){routing}
                FROM approvals_occurrence o WHERE {where}"""  # noqa: S608
    [(total, last_change, *versions)] = fetch(sql, [*routing_params, *params])
    if versions:
        mine, fallback = versions
        query = replace(query, routed_versions=tuple(mine), fallback_versions=tuple(fallback))
    return InboxCount(int(total), last_change, query)


def inbox_last_event(query: InboxQuery, *, offset: int, limit: int) -> int | None:
    """The newest audit event of the occurrences on one page of the inbox."""
    if not query.tenant_ids:
        return None
    if not on_postgresql():
        page = _inbox_filtered(query).values("pk")[offset : offset + limit]
        found = AuditEvent.objects.filter(occurrence_id__in=page).aggregate(last=Max("id"))
        return found["last"]
    where, params = _where(query)
    order, order_params = _order(query)
    sql = f"""SELECT MAX(e.id) FROM approvals_auditevent e
               WHERE e.occurrence_id IN ({_page_ids(where, order)})"""  # noqa: S608
    [(last,)] = fetch(sql, [*params, *order_params, limit, offset])
    return last


_OCCURRENCE = Columns(Occurrence, "o")
_PROPOSAL = Columns(Proposal, "p")
_APPROVAL = Columns(Approval, "a")

_INBOX_PROPOSALS = f"""
SELECT {_PROPOSAL.sql},
       (SELECT COUNT(v.id) FROM approvals_approvalvote v WHERE v.proposal_id = p.id)
  FROM approvals_proposal p
 WHERE p.occurrence_id = ANY(%s) AND p.is_current"""  # noqa: S608 (no input in the text)

_RECOVERY_KINDS = (AuditKind.RECOVERY_INTERRUPTED.value, AuditKind.EPOCH_ADMITTED.value)
# Each approval with its command's state and whether an authentication challenge
# interrupted it (the newest of its interruption and epoch events is an interruption): a
# consumed approval's row says what its effect came to, in the same query.
_INBOX_APPROVALS = f"""
SELECT {_APPROVAL.sql}, c.state,
       (SELECT e.kind FROM approvals_auditevent e
         WHERE e.command_id = c.id
           AND e.kind IN ({words(vocabulary.EFFECT_KINDS)})
           AND e.kind IN ({words(_RECOVERY_KINDS)})
         ORDER BY e.id DESC LIMIT 1) = '{AuditKind.RECOVERY_INTERRUPTED.value}'
  FROM approvals_approval a
  JOIN approvals_proposal p ON p.id = a.proposal_id
  LEFT JOIN approvals_command c ON c.approval_id = a.id
 WHERE a.occurrence_id = ANY(%s) AND p.is_current"""  # noqa: S608


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
    page, proposals, approvals = (
        _page_rows(query, offset, limit) if query.tenant_ids else ([], [], [])
    )
    by_occurrence: dict[Any, tuple[list[Proposal], list[Approval]]] = {
        occurrence.pk: ([], []) for occurrence in page
    }
    for proposal in proposals:
        by_occurrence[proposal.occurrence_id][0].append(proposal)
    for approval in approvals:
        by_occurrence[approval.occurrence_id][1].append(approval)
    missing = {o.tool_id for o in page} - tools.keys()
    if missing:
        tools = {**tools, **ToolContract.objects.in_bulk(missing)}
    tenant_of = {tenant.pk: tenant for tenant in tenants}
    for occurrence in page:
        current = by_occurrence[occurrence.pk]
        occurrence.current_proposals = current[0]  # type: ignore[attr-defined]
        occurrence.current_approvals = current[1]  # type: ignore[attr-defined]
        occurrence.tool = tools[occurrence.tool_id]
        tenant = tenant_of.get(occurrence.tenant_id)
        if tenant is not None:  # else read when shown: a page filters by the reader's tenants
            occurrence.tenant = tenant
    return page


def _page_rows(
    query: InboxQuery, offset: int, limit: int
) -> tuple[list[Occurrence], list[Proposal], list[Approval]]:
    """The page's occurrences (each with ``routed_first``: routed to the reader), and their
    current proposals (each with ``votes_count``) and approvals."""
    if not on_postgresql():
        page = list(_inbox_filtered(query)[offset : offset + limit])
        ids = [o.pk for o in page]
        current = Proposal.objects.filter(occurrence_id__in=ids, is_current=True)
        counted = current.annotate(votes_count=Count("votes"))
        of_page = Approval.objects.filter(
            occurrence_id__in=ids, proposal__is_current=True
        ).annotate(
            command_state=F("command__state"),
            last_recovery=Subquery(
                AuditEvent.objects.filter(
                    command_id=OuterRef("command__pk"),
                    kind__in=_RECOVERY_KINDS,
                )
                .order_by("-id")
                .values("kind")[:1]
            ),
        )
        loaded: list[Approval] = list(of_page)
        for approval in loaded:
            state, last = getattr(approval, "command_state"), getattr(approval, "last_recovery")  # noqa: B009
            interrupted = None if state is None else last == AuditKind.RECOVERY_INTERRUPTED
            approval.interrupted = interrupted  # type: ignore[attr-defined]
        return page, list(counted), loaded
    where, params = _where(query)
    order, order_params = _order(query)
    routed, routed_params = _routed(query)
    sql = f"""SELECT {_OCCURRENCE.sql}, {routed} FROM approvals_occurrence o
               WHERE {where} AND o.id IN ({_page_ids(where, order)})
               ORDER BY {order}"""  # noqa: S608
    page = []
    for row in fetch(
        sql, [*routed_params, *params, *params, *order_params, limit, offset, *order_params]
    ):
        occurrence, occurrence.routed_first = split(row, _OCCURRENCE, 1)
        page.append(occurrence)
    ids = [o.pk for o in page]
    if not ids:
        return page, [], []
    proposals = []
    for row in fetch(_INBOX_PROPOSALS, [ids]):
        proposal, votes = split(row, _PROPOSAL, 1)
        proposal.votes_count = votes
        proposals.append(proposal)
    approvals: list[Approval] = []
    for row in fetch(_INBOX_APPROVALS, [ids]):
        approval, command_state, interrupted = split(row, _APPROVAL, 2)
        approval.command_state = command_state
        approval.interrupted = None if command_state is None else bool(interrupted)
        approvals.append(approval)
    return page, proposals, approvals
