"""Bulk review's read: the selected requests of the reviewer's tenants, with their current
version, in the order they were selected."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db.models import Prefetch

from approvals.models import Occurrence, Proposal
from approvals.reviews.selectors import snapshot


def bulk_occurrences(*, ids: Iterable[uuid.UUID], tenant_ids: list[int]) -> list[Occurrence]:
    """The requests among ``ids`` that belong to ``tenant_ids``, each with its current
    proposal in ``current_proposals``; another tenant's are left out as if they did not
    exist. Three queries, one snapshot."""
    wanted = list(ids)
    with snapshot():
        found = {
            occurrence.pk: occurrence
            for occurrence in Occurrence.objects.filter(pk__in=wanted, tenant_id__in=tenant_ids)
            .select_related("tool", "tenant")
            .defer("tool__json_schema", "tool__description")
            .prefetch_related(
                Prefetch(
                    "proposals",
                    queryset=Proposal.objects.filter(is_current=True),
                    to_attr="current_proposals",
                )
            )
        }
    return [found[pk] for pk in wanted if pk in found]
