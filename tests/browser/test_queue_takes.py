""" "I'm on it" in Chromium (issue 25): Rita takes an item from the queue, Sam's open queue
shows "Rita is on it" by its own poll, the filter "Mine" shows Rita her item (and carries
it in the address), Sam takes it over from the timeline after confirming, and axe-core
finds nothing on the pages with owners shown."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import Membership, Tenant
from reconciliation.models import QueueTake
from tests.browser.a11y import AxeReport
from tests.browser.conftest import Contexts, login
from tests.conftest import Runtime, make_user
from tests.reconciliation.test_queue_identifies import expired

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The queue polls every 5 s.
POLL_TIMEOUT_MS = 15_000
TAKE = "I\u2019m on it"  # the button, with its typographic apostrophe


def operator_named(tenant: Tenant, username: str, first_name: str) -> Any:
    user = make_user(username, tenant, Membership.Role.OPERATOR)
    user.first_name = first_name
    user.save(update_fields=["first_name"])
    return user


def test_an_operator_takes_an_item_and_the_others_see_who_is_on_it(
    contexts: Contexts, runtime: Runtime, reviewer: Any, tenant: Tenant
) -> None:
    rita = operator_named(tenant, "rita.ops", "Rita")
    sam = operator_named(tenant, "sam.ops", "Sam")
    taken = expired(runtime, reviewer, "pay_Take1", minutes_ago=30)
    other = expired(runtime, reviewer, "pay_Free2", minutes_ago=20)
    taken_row = f'tr[data-item="expired_unclaimed:{taken.pk}"]'
    other_row = f'tr[data-item="expired_unclaimed:{other.pk}"]'
    axe = AxeReport()

    sams = contexts.new(bypass_csp=True).new_page()
    login(sams, sam.username)
    sams.goto("/operations/")
    expect(sams.locator(taken_row).get_by_role("button")).to_contain_text(TAKE)

    ritas = contexts.new(bypass_csp=True).new_page()
    login(ritas, rita.username)
    ritas.goto("/operations/")
    with ritas.expect_navigation():
        ritas.locator(taken_row).get_by_role("button", name=re.compile(TAKE)).click()
    expect(ritas.locator(".messages")).to_contain_text("You are on it")
    expect(ritas.locator(taken_row)).to_contain_text("You are on it")
    expect(ritas.locator(taken_row).get_by_role("button")).to_contain_text("Let go")
    assert QueueTake.objects.get(occurrence_id=taken.occurrence_id).holder_id == rita.pk

    # Sam's queue, left open, learns it by its poll: no reload.
    expect(sams.locator(taken_row)).to_contain_text("Rita is on it", timeout=POLL_TIMEOUT_MS)
    expect(sams.locator(taken_row).get_by_role("button")).to_have_count(0)
    expect(sams.locator(other_row).get_by_role("button")).to_contain_text(TAKE)
    axe.check(sams, "queue with another's item")

    # Mine: Rita's item only, the filter kept in the address and in the form.
    ritas.locator("#filter-owner").select_option("mine")
    expect(ritas.locator(other_row)).to_have_count(0)
    expect(ritas.locator(taken_row)).to_be_visible()
    expect(ritas).to_have_url(re.compile(r"owner=mine"))
    ritas.reload()
    expect(ritas.locator("#filter-owner")).to_have_value("mine")
    expect(ritas.locator("#queue-total")).to_have_text("1")
    axe.check(ritas, "queue filtered to mine")
    # Sam's "Mine" is empty; "Unowned" is the other item.
    sams.goto("/operations/?owner=mine")
    expect(sams.locator(".empty")).to_contain_text("Nothing needs a person for these filters")
    sams.goto("/operations/?owner=unowned")
    expect(sams.locator(other_row)).to_be_visible()
    expect(sams.locator(taken_row)).to_have_count(0)

    # On the timeline Sam sees who has it, and takes it over only after confirming.
    sams.goto(f"/operations/occurrences/{taken.occurrence_id}/")
    expect(sams.locator("#on-it-status")).to_contain_text("Rita is on it")
    axe.check(sams, "timeline of another's item")
    sams.locator("#take-over").get_by_role("checkbox").check()
    with sams.expect_navigation():
        sams.locator("#take-over").get_by_role("button", name="Take over").click()
    expect(sams.locator(".messages")).to_contain_text("You took it over from Rita")
    expect(sams.locator("#on-it-status")).to_contain_text("You are on it")
    expect(sams.locator(".timeline-table")).to_contain_text("operations.taken_over")
    ritas.goto("/operations/")
    expect(ritas.locator(taken_row)).to_contain_text("Sam is on it")
    axe.assert_clean()
