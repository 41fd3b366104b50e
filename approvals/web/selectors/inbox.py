"""The inbox's reads: a page of occurrences with their current proposal and approval, and
the stamp that tells a poll whether anything changed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import (
    Count,
    Max,
    QuerySet,
    Value,
)

from approvals.compiled import Compiled, Param, ParamArray, ParamList
from approvals.models import (
    Approval,
    AuditEvent,
    Occurrence,
    Proposal,
    Tenant,
    ToolContract,
)
from approvals.web.selectors.access import _TENANT_PK


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
