"""An admin opens the list of past bulk revocations from the revocation page, in Chromium."""

from __future__ import annotations

import os
import uuid

import pytest
from playwright.sync_api import expect

from approvals.models import Approval, Membership, Tenant
from approvals.reviews.revocation import approvals_revoke_by_admin
from tests.browser.a11y import AxeReport
from tests.browser.conftest import Contexts, login, propose
from tests.conftest import Runtime, approve, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = os.environ.get("CONSOLE_SHOTS_DIR", "")


def test_past_revocations_are_listed_with_who_when_filter_and_count(
    contexts: Contexts, tenant: Tenant, runtime: Runtime, reviewer: object
) -> None:
    ada = make_user("ada", tenant, Membership.Role.ADMIN)
    for n in range(2):
        assert approve(propose(runtime, client_ref=f"ref-{n}"), reviewer).issued
    batch = uuid.uuid4().hex
    approvals_revoke_by_admin(
        approvals=Approval.objects.all(),
        admin=ada,
        reason="Compromised run",
        batch=batch,
        described="tool issue_refund",
    )
    page = contexts.new(bypass_csp=True).new_page()
    login(page, "ada")
    page.goto("/manage/revocations/")
    page.get_by_role("link", name="Past revocations").click()
    row = page.locator(f'tr[data-batch="{batch}"]')
    expect(row).to_contain_text("ada")
    expect(row).to_contain_text("tool issue_refund")
    expect(row).to_contain_text("2 approvals")
    expect(row).to_contain_text("Compromised run")
    axe = AxeReport()
    axe.check(page, "past revocations")
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "revocation-batches.png"))
    axe.assert_clean()
