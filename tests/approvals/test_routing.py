"""Issue 26, routing: reviewer groups and versioned rules per tool contract pick who is
asked; the proposal records the version that routed it, for at most one query more than
before routing and notifications existed; the inbox lists what is routed to a reviewer
first; every change of a rule is a new version with an audit event."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.errors import InputError
from approvals.models import (
    AuditEvent,
    NotificationEvent,
    Occurrence,
    ReviewerGroup,
    RoutingRuleVersion,
    Tenant,
)
from approvals.routing.changes import (
    reviewer_group_save,
    routing_rule_remove,
    routing_rule_save,
)
from approvals.vocabulary import AuditKind
from tests.conftest import REFUND_ARGS, Runtime, make_user


def refund(amount: int, currency: str = "EUR") -> dict[str, Any]:
    return {**REFUND_ARGS, "amount_minor": amount, "currency": currency}


@pytest.fixture
def groups(
    tenant: Tenant, admin_user: Any, reviewer: Any, second_reviewer: Any
) -> dict[str, ReviewerGroup]:
    support = reviewer_group_save(
        tenant=tenant, admin=admin_user, name="support", member_ids=[reviewer.pk]
    ).group
    leads = reviewer_group_save(
        tenant=tenant, admin=admin_user, name="finance-leads", member_ids=[second_reviewer.pk]
    ).group
    return {"support": support, "leads": leads}


@pytest.fixture
def rules(
    tenant: Tenant, admin_user: Any, groups: dict[str, ReviewerGroup]
) -> dict[str, RoutingRuleVersion]:
    small = routing_rule_save(
        tenant=tenant,
        admin=admin_user,
        tool="issue_refund",
        name="refunds",
        group_ids=[groups["support"].pk],
        fallback_group_id=groups["leads"].pk,
    )
    large = routing_rule_save(
        tenant=tenant,
        admin=admin_user,
        tool="issue_refund",
        name="large refunds",
        group_ids=[groups["leads"].pk],
        currency="EUR",
        amount_over_minor=50000,
    )
    return {"small": small, "large": large}


def routed_by(response: Any) -> RoutingRuleVersion | None:
    assert response.status_code in (200, 201), response.content
    return Occurrence.objects.get(pk=response.json()["occurrence_id"]).routed_by


def test_a_request_is_routed_by_its_amount_band(
    runtime: Runtime, rules: dict[str, RoutingRuleVersion]
) -> None:
    assert routed_by(runtime.propose(arguments=refund(8000), client_ref="a")) == rules["small"]
    assert routed_by(runtime.propose(arguments=refund(50000), client_ref="b")) == rules["small"]
    assert routed_by(runtime.propose(arguments=refund(50001), client_ref="c")) == rules["large"]
    # Another currency is outside the EUR band: the rule without a band routes it.
    assert (
        routed_by(runtime.propose(arguments=refund(90000, "USD"), client_ref="d")) == rules["small"]
    )


def test_no_rule_no_route_and_another_tenants_rules_never_apply(
    runtime: Runtime, other_tenant: Tenant, groups: dict[str, ReviewerGroup]
) -> None:
    admin = make_user("olga", other_tenant, "admin")
    group = reviewer_group_save(tenant=other_tenant, admin=admin, name="x", member_ids=[]).group
    routing_rule_save(
        tenant=other_tenant, admin=admin, tool="issue_refund", name="all", group_ids=[group.pk]
    )
    assert routed_by(runtime.propose()) is None


def test_a_change_is_a_new_version_audited_with_who_and_what(
    runtime: Runtime,
    tenant: Tenant,
    admin_user: Any,
    groups: dict[str, ReviewerGroup],
    rules: dict[str, RoutingRuleVersion],
) -> None:
    first = routed_by(runtime.propose(arguments=refund(60000), client_ref="a"))
    assert first is not None
    changed = routing_rule_save(
        tenant=tenant,
        admin=admin_user,
        tool="issue_refund",
        name="large refunds",
        group_ids=[groups["leads"].pk, groups["support"].pk],
        currency="EUR",
        amount_over_minor=100000,
    )
    assert changed.rule_id == first.rule_id and changed.version == 2
    first.refresh_from_db()
    assert not first.is_current and changed.is_current
    # The earlier request still names the version that routed it.
    assert Occurrence.objects.get(client_ref="a").routed_by == first
    assert routed_by(runtime.propose(arguments=refund(60000), client_ref="b")) == rules["small"]
    event = AuditEvent.objects.filter(kind=AuditKind.ROUTING_RULE_SAVED).latest("id")
    assert event.actor == admin_user.username
    assert event.data["before"]["amount_over_minor"] == 50000
    assert event.data["after"]["amount_over_minor"] == 100000
    assert event.data["after"]["groups"] == ["finance-leads", "support"]

    assert routing_rule_remove(tenant=tenant, admin=admin_user, rule_id=changed.rule_id)
    assert routed_by(runtime.propose(arguments=refund(200000), client_ref="c")) == rules["small"]
    assert AuditEvent.objects.filter(kind=AuditKind.ROUTING_RULE_REMOVED).count() == 1
    assert not routing_rule_remove(tenant=tenant, admin=admin_user, rule_id=changed.rule_id)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"group_ids": []}, "invalid_group"),
        ({"currency": "EUR"}, "invalid_band"),
        ({"currency": "EUR", "amount_over_minor": 10, "amount_up_to_minor": 5}, "invalid_band"),
        ({"currency": "ZZZ", "amount_over_minor": 10}, "invalid_band"),
        ({"tool": "send_message", "currency": "EUR", "amount_over_minor": 10}, "invalid_band"),
        ({"tool": "no_such_tool"}, "unknown_tool"),
        ({"name": ""}, "invalid_name"),
    ],
)
def test_bad_rules_are_refused_and_nothing_is_written(
    tenant: Tenant,
    admin_user: Any,
    groups: dict[str, ReviewerGroup],
    fields: dict[str, Any],
    code: str,
) -> None:
    values: dict[str, Any] = {
        "tool": "issue_refund",
        "name": "r",
        "group_ids": [groups["support"].pk],
        **fields,
    }
    with pytest.raises(InputError) as refused:
        routing_rule_save(tenant=tenant, admin=admin_user, **values)
    assert refused.value.code == code
    assert not RoutingRuleVersion.objects.exists()


def test_a_group_of_another_tenant_is_refused(
    tenant: Tenant, other_tenant: Tenant, admin_user: Any, groups: dict[str, ReviewerGroup]
) -> None:
    stranger = make_user("stranger", other_tenant, "reviewer")
    with pytest.raises(InputError):
        reviewer_group_save(tenant=tenant, admin=admin_user, name="g", member_ids=[stranger.pk])
    foreign = reviewer_group_save(
        tenant=other_tenant, admin=make_user("o", other_tenant, "admin"), name="g", member_ids=[]
    ).group
    with pytest.raises(InputError):
        routing_rule_save(
            tenant=tenant, admin=admin_user, tool="issue_refund", name="r", group_ids=[foreign.pk]
        )


def _proposal_queries(runtime: Runtime, client_ref: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        assert runtime.propose(arguments=refund(60000), client_ref=client_ref).status_code == 201
    return [q["sql"] for q in captured.captured_queries]


@pytest.mark.django_db(transaction=False)
def test_creating_a_request_costs_one_query_more_than_without_routing(
    runtime: Runtime, rules: dict[str, RoutingRuleVersion], monkeypatch: pytest.MonkeyPatch
) -> None:
    """main's proposal made N queries; routing (chosen inside the INSERT) and the
    notification outbox (one INSERT) make it N + 1. Main's count is measured here by
    taking both out again."""
    _proposal_queries(runtime, "warm-up")  # the key's cache, the contract's first read
    routed = _proposal_queries(runtime, "routed")

    from approvals.reviews import proposals

    monkeypatch.setattr(proposals, "notification_event_create", lambda **_: None)
    monkeypatch.setattr(proposals, "routing_version", lambda **_: None)
    bare = _proposal_queries(runtime, "bare")

    assert len(routed) == len(bare) + 1, "\n".join(routed)
    extra = [q for q in routed if "approvals_notificationevent" in q]
    assert len(extra) == 1 and extra[0].startswith("INSERT")
    insert = next(q for q in routed if q.startswith('INSERT INTO "approvals_occurrence"'))
    assert "approvals_routingruleversion" in insert
    assert Occurrence.objects.get(client_ref="routed").routed_by == rules["large"]
    assert NotificationEvent.objects.filter(occurrence__client_ref="routed").count() == 1


# --- the inbox: routed to you first ------------------------------------------------------------


def _inbox_rows(client: Any) -> list[tuple[str, bool]]:
    from tests.approvals.test_views_html import parse

    page = parse(client.get("/reviews/?state=all"))
    return [
        (str(tr.attrs["data-occurrence-id"]), "data-routed" in tr.attrs)
        for tr in page.find_all("tr")
        if "data-occurrence-id" in tr.attrs
    ]


def test_the_inbox_lists_what_is_routed_to_the_reader_first(
    runtime: Runtime, second_reviewer: Any, rules: dict[str, RoutingRuleVersion]
) -> None:
    from tests.approvals.test_views_html import signed_in

    large = runtime.propose(arguments=refund(90000), client_ref="large").json()["occurrence_id"]
    small = [
        runtime.propose(arguments=refund(100 + n), client_ref=f"s{n}").json()["occurrence_id"]
        for n in range(3)
    ]
    # second_reviewer is in finance-leads: the large refund first, though it is the oldest.
    rows = _inbox_rows(signed_in(second_reviewer))
    assert rows[0] == (large, True)
    assert [r for r, routed in rows[1:] if routed] == []
    assert {r for r, _ in rows[1:]} == set(small)
    # Once a small one is escalated, its fallback group (finance-leads) is asked too.
    Occurrence.objects.filter(pk=small[0]).update(
        escalated_at=Occurrence.objects.get(pk=small[0]).created_at
    )
    rows = _inbox_rows(signed_in(second_reviewer))
    assert {r for r, routed in rows[:2] if routed} == {large, small[0]}
    # Decided, it is no longer asked of anyone: it takes its place by age again.
    Occurrence.objects.filter(pk=large).update(status=Occurrence.Status.REJECTED)
    rows = _inbox_rows(signed_in(second_reviewer))
    assert rows[0] == (small[0], True) and (large, False) in rows


def test_joining_a_group_ends_the_inbox_polls_204s(
    runtime: Runtime,
    tenant: Tenant,
    admin_user: Any,
    reviewer: Any,
    second_reviewer: Any,
    groups: dict[str, ReviewerGroup],
    rules: dict[str, RoutingRuleVersion],
) -> None:
    """The poll's "nothing changed" stamp covers the rule versions routing to the reader:
    a reviewer added to a group sees its requests move up and get their badge at the next
    poll, not only when some request changes (or the minute turns)."""
    from tests.approvals.test_views_html import parse, signed_in

    if connection.vendor != "postgresql":
        pytest.skip("the count's statement reads the routing on PostgreSQL only")
    large = runtime.propose(arguments=refund(90000), client_ref="large").json()["occurrence_id"]
    client = signed_in(reviewer)  # in support: the large refund is finance-leads'
    assert (large, False) in _inbox_rows(client)
    poll = str(parse(client.get("/reviews/")).attr("inbox-list", "hx-get"))
    htmx = {"HX-Request": "true"}
    assert client.get(poll, headers=htmx).status_code == 204
    reviewer_group_save(
        tenant=tenant,
        admin=admin_user,
        name="finance-leads",
        member_ids=[second_reviewer.pk, reviewer.pk],
        group=groups["leads"],
    )
    answer = client.get(poll, headers=htmx)
    assert answer.status_code == 200
    rows = [
        (str(tr.attrs["data-occurrence-id"]), "data-routed" in tr.attrs)
        for tr in parse(answer).find_all("tr")
        if "data-occurrence-id" in tr.attrs
    ]
    assert rows == [(large, True)]


def _badged(rows: list[Occurrence]) -> list[tuple[Any, bool]]:
    """Each row and whether the read says it is routed to the reader."""
    return [(o.pk, o.routed_first) for o in rows]  # type: ignore[attr-defined]


def test_the_routed_order_reads_as_its_orm_twin(
    runtime: Runtime,
    reviewer: Any,
    second_reviewer: Any,
    admin_user: Any,
    rules: dict[str, RoutingRuleVersion],
) -> None:
    """The SQL reads order by the rule versions the count's statement read for the reader;
    the ORM twins ask the reader's groups row by row: the same rows, order and badges."""
    from approvals.web.selectors import inbox
    from approvals.web.selectors.inbox import InboxQuery

    if connection.vendor != "postgresql":
        pytest.skip("the SQL reads run on PostgreSQL only")
    for n, amount in enumerate([90000, 100, 70000, 200, 300]):
        runtime.propose(arguments=refund(amount), client_ref=f"c{n}")
    # The newest, routed by no rule (no rule for its tool): never first for being unrouted.
    message = {"to": "a@b.c", "subject": "s", "body": "b"}
    assert runtime.propose("send_message", arguments=message, client_ref="u").status_code == 201
    # One small refund escalated: finance-leads (its rule's fallback group) is asked too.
    Occurrence.objects.filter(client_ref="c3").update(escalated_at=timezone.now())
    tenant_id = runtime.key.tenant_id
    asked = {}
    for user in (reviewer, second_reviewer, admin_user):  # support, finance-leads, neither
        counted = inbox.inbox_total(InboxQuery([tenant_id], reader_id=user.pk))
        query = counted.query
        assert counted.total == 6
        for offset, limit in ((0, 2), (1, 3), (0, 25)):
            read = _badged(inbox._page_rows(query, offset, limit)[0])
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(inbox, "on_postgresql", lambda: False)
                orm = _badged(inbox._page_rows(query, offset, limit)[0])
                last_orm = inbox.inbox_last_event(query, offset=offset, limit=limit)
                assert inbox.inbox_total(query) == counted
            assert read == orm
            assert inbox.inbox_last_event(query, offset=offset, limit=limit) == last_orm
        rows = inbox._page_rows(query, 0, 25)[0]
        asked[user.username] = [
            o.client_ref for o, (_, routed) in zip(rows, _badged(rows), strict=True) if routed
        ]
    assert asked == {
        reviewer.username: ["c4", "c3", "c1"],  # the small ones, newest first
        second_reviewer.username: ["c3", "c2", "c0"],  # the large ones and the escalated one
        admin_user.username: [],
    }


# --- the admin page ----------------------------------------------------------------------------


def test_the_routing_page_is_for_admins_of_the_tenant_only(
    tenant: Tenant, reviewer: Any, admin_user: Any, other_tenant: Tenant
) -> None:
    from tests.approvals.test_views_html import signed_in

    assert signed_in(reviewer).get("/manage/routing/").status_code == 403
    assert signed_in(reviewer).post("/manage/routing/groups", {"name": "x"}).status_code == 403
    admin = signed_in(admin_user)
    assert admin.get("/manage/routing/").status_code == 200
    assert admin.get(f"/manage/routing/?tenant={other_tenant.slug}").status_code == 404
    posted = admin.post("/manage/routing/groups", {"tenant": other_tenant.slug, "name": "mine now"})
    assert posted.status_code == 404
    assert not ReviewerGroup.objects.exists()


def test_an_admin_edits_groups_and_rules_on_the_page_with_csrf(
    runtime: Runtime, tenant: Tenant, admin_user: Any, second_reviewer: Any, settings: Any
) -> None:
    settings.CALLBACK_ALLOW_HTTP = settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    from django.test import Client

    from tests.conftest import PASSWORD

    strict = Client(enforce_csrf_checks=True)
    strict.login(username=admin_user.username, password=PASSWORD)
    assert strict.post("/manage/routing/groups", {"name": "x"}).status_code == 403  # no token

    from tests.approvals.test_views_html import signed_in

    admin = signed_in(admin_user)
    saved = admin.post(
        "/manage/routing/groups",
        {
            "tenant": tenant.slug,
            "name": "finance-leads",
            "members": [second_reviewer.pk],
            "webhook_url": "http://127.0.0.1:9/hook",
        },
    )
    # A new webhook's secret is shown once, after the redirect (test_routing_page.py).
    assert saved.status_code == 302 and b"whsec_" not in saved.content
    group = ReviewerGroup.objects.get(name="finance-leads")
    assert admin.get(saved["Location"]).content.count(b"whsec_") == 1
    assert admin.get("/manage/routing/").content.count(b"whsec_") == 0
    answer = admin.post(
        "/manage/routing/rules",
        {
            "tenant": tenant.slug,
            "tool": "issue_refund",
            "name": "large refunds",
            "groups": [group.pk],
            "currency": "EUR",
            "amount_over": "500.00",
        },
    )
    assert answer.status_code == 302, answer.content
    version = RoutingRuleVersion.objects.get()
    assert (version.currency, version.amount_over_minor, version.created_by) == (
        "EUR",
        50000,
        admin_user,
    )
    bad = admin.post(
        "/manage/routing/rules",
        {
            "tenant": tenant.slug,
            "tool": "issue_refund",
            "name": "x",
            "groups": [group.pk],
            "currency": "EUR",
            "amount_over": "5.001",
        },
    )
    assert bad.status_code == 422 and b"too many decimals" in bad.content
    page = admin.get("/manage/routing/").content.decode()
    assert "large refunds" in page and "above EUR 500.00" in page

    # The review page says which rule routed a request.
    occurrence_id = runtime.propose(arguments=refund(70000)).json()["occurrence_id"]
    review = signed_in(second_reviewer).get(f"/reviews/{occurrence_id}/").content.decode()
    assert "large refunds</strong> v1" in review and "to finance-leads" in review


def test_a_groups_secrets_survive_a_secret_key_rotation(
    tenant: Tenant, admin_user: Any, settings: Any
) -> None:
    """The Slack URL and the webhook secret are stored encrypted, readable with the old key
    in SECRET_KEY_FALLBACKS, and moved onto the new key by ``reencrypt_secrets``."""
    import io

    from django.core.management import call_command

    from approvals.routing.changes import group_secret_decrypt

    settings.CALLBACK_ALLOW_HTTP = settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "old-" + "k" * 50, []
    slack = "https://hooks.slack.example/services/T0/B0/secret"
    saved = reviewer_group_save(
        tenant=tenant,
        admin=admin_user,
        name="g",
        member_ids=[],
        slack_webhook_url=slack,
        webhook_url="https://hooks.example/console",
    )
    group = ReviewerGroup.objects.get(pk=saved.group.pk)
    assert slack not in group.slack_webhook_encrypted
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "new-" + "k" * 50, ["old-" + "k" * 50]
    assert group_secret_decrypt(group.slack_webhook_encrypted) == slack
    call_command("reencrypt_secrets", stdout=io.StringIO())
    settings.SECRET_KEY_FALLBACKS = []
    group.refresh_from_db()
    assert group_secret_decrypt(group.slack_webhook_encrypted) == slack
    assert group_secret_decrypt(group.webhook_secret_encrypted) == saved.secret
