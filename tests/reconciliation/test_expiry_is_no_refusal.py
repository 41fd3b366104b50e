"""An approval's own expiry (the sweep writing down what the clock decided) is not a refused
use of it: the review page, the operator's timeline and the investigation flag the claim
that came too late, never the expiry itself."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import Approval
from approvals.reviews.expiry import approvals_expire
from approvals.vocabulary import AuditKind, ClaimDecision, is_refused_use
from tests.conftest import PASSWORD, Runtime

pytestmark = pytest.mark.django_db

_TAGS = re.compile(r"<[^>]+>")


def flags_by_kind(html: str, row_class: str) -> dict[str, str]:
    """{event kind: its row's flag ("" for none)} for the rows ``<… class="row_class…">``."""
    found: dict[str, str] = {}
    for match in re.finditer(rf'class="{row_class}(?: {row_class}--(\w+))?"', html):
        rest = html[match.end() :]
        kind = re.search(r'<code class="event-kind">(.*?)</code>', rest, re.S)
        assert kind is not None
        found.setdefault(_TAGS.sub("", kind.group(1)), match.group(1) or "")
    return found


def test_the_vocabulary_tells_an_expiry_from_a_refused_claim() -> None:
    assert is_refused_use(AuditKind.for_claim(ClaimDecision.EXPIRED), ClaimDecision.EXPIRED)
    assert not is_refused_use(AuditKind.APPROVAL_EXPIRED, ClaimDecision.EXPIRED)
    assert is_refused_use(AuditKind.APPROVAL_REVOKED, ClaimDecision.REVOKED)
    assert not is_refused_use(AuditKind.for_claim(ClaimDecision.APPROVED), ClaimDecision.APPROVED)


def test_an_expiry_is_not_flagged_and_the_late_claim_is(
    runtime: Runtime, reviewer: Any, operator: Any, token: str, approved: str
) -> None:
    # PostgreSQL's now() is the test transaction's start, before the fixtures ran.
    past = timezone.now() - timedelta(minutes=5)
    Approval.objects.filter(occurrence_id=approved).update(
        issued_at=past - timedelta(minutes=15), expires_at=past
    )
    assert approvals_expire() == 1
    late = runtime.claim(token, "exec-too-late")
    assert late.status_code == 403 and late.json()["decision"] == "expired"

    expired, refused = AuditKind.APPROVAL_EXPIRED, AuditKind.for_claim(ClaimDecision.EXPIRED)
    pages = [
        (reviewer, f"/reviews/{approved}/", "history-event"),
        (operator, f"/operations/occurrences/{approved}/", "timeline-entry"),
        (operator, "/investigations/?q=exec-too-late", "chain-row"),
    ]
    for user, path, row_class in pages:
        client = Client()
        assert client.login(username=user.username, password=PASSWORD)
        response = client.get(path)
        assert response.status_code == 200, path
        flags = flags_by_kind(response.content.decode(), row_class)
        assert flags.get(expired) == "", (path, flags)
        assert flags.get(refused) == "security", (path, flags)
