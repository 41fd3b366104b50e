"""Issue 26, a group's Slack app on the admin page (``/manage/routing/``) and around it:
an admin sets, replaces and removes a group's bot token and channel id (CSRF, tenant-scoped,
admins only, post/redirect/get); a bad token or channel id is the form's error, never a
500; the token is never shown again, logged or audited; a failing app channel is shown to
admins; key rotation keeps it readable; the demo's catcher plays Slack's Web API. The
sending and threading themselves: ``test_slack_app.py``."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from approvals.errors import InputError
from approvals.models import AuditEvent, ReviewerGroup, Tenant
from approvals.routing.changes import group_secret_decrypt, reviewer_group_save
from tests.approvals.test_notifications import drain, propose
from tests.approvals.test_slack_app import CHANNEL, TOKEN, Groups, SlackApi, groups, slack_api
from tests.approvals.test_views_html import signed_in
from tests.conftest import Runtime

__all__ = ["groups", "slack_api"]  # the fixtures, for the failing channel's test

# --- the service -----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"slack_bot_token": "xoxp-user-token-0000000000"}, "invalid_slack_token"),
        ({"slack_bot_token": "xoxb-short"}, "invalid_slack_token"),
        ({"slack_bot_token": TOKEN, "slack_channel_id": "#general"}, "invalid_slack_channel"),
        ({"slack_bot_token": TOKEN}, "slack_channel_required"),
        ({"slack_channel_id": CHANNEL}, "slack_token_required"),
    ],
)
def test_a_bad_token_or_channel_is_refused(
    tenant: Tenant, admin_user: Any, fields: dict[str, str], code: str
) -> None:
    with pytest.raises(InputError) as refused:
        reviewer_group_save(
            tenant=tenant,
            admin=admin_user,
            name="g",
            member_ids=[],
            slack_bot_token=fields.get("slack_bot_token"),
            slack_channel_id=fields.get("slack_channel_id"),
        )
    assert refused.value.code == code
    assert "xoxp-user" not in refused.value.message
    assert not ReviewerGroup.objects.exists()


@pytest.mark.django_db
def test_a_rotated_secret_key_still_reads_the_token_and_reencrypting_moves_it(
    tenant: Tenant, admin_user: Any, settings: Any
) -> None:
    from io import StringIO

    from django.core.management import call_command

    old_key = settings.SECRET_KEY
    group = reviewer_group_save(
        tenant=tenant,
        admin=admin_user,
        name="leads",
        member_ids=[],
        slack_bot_token=TOKEN,
        slack_channel_id=CHANNEL,
    ).group
    settings.SECRET_KEY = "a-new-secret-key-for-the-rotation-test-0123456789abcdef"
    settings.SECRET_KEY_FALLBACKS = [old_key]
    call_command("reencrypt_secrets", stdout=StringIO())
    settings.SECRET_KEY_FALLBACKS = []
    group.refresh_from_db()
    assert group_secret_decrypt(group.slack_bot_token_encrypted) == TOKEN


# --- the admin page --------------------------------------------------------------------------


def save_group(client: Any, tenant: Tenant, **fields: Any) -> Any:
    return client.post("/manage/routing/groups", {"tenant": tenant.slug, **fields})


@pytest.mark.django_db
def test_an_admin_sets_replaces_and_removes_a_groups_slack_app_on_the_page(
    tenant: Tenant, admin_user: Any, second_reviewer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    admin = signed_in(admin_user)
    posted = save_group(
        admin,
        tenant,
        name="finance-leads",
        members=[second_reviewer.pk],
        slack_bot_token=TOKEN,
        slack_channel_id="c0123abcd",  # typed in lower case: Slack's ids are upper case
    )
    assert (
        posted.status_code == 302 and posted["Location"] == f"/manage/routing/?tenant={tenant.slug}"
    )
    group = ReviewerGroup.objects.get()
    assert group.slack_channel_id == CHANNEL
    assert group_secret_decrypt(group.slack_bot_token_encrypted) == TOKEN

    page = admin.get(posted["Location"]).content.decode()
    assert "Slack app · C0123ABCD" in page and TOKEN not in page
    chosen = admin.get(f"/manage/routing/?tenant={tenant.slug}&group={group.pk}").content.decode()
    assert 'value="C0123ABCD"' in chosen and "This group has one" in chosen
    assert 'name="remove_slack_app"' in chosen and TOKEN not in chosen

    # Empty keeps the token; a new channel changes the channel alone.
    kept = save_group(
        admin, tenant, group=group.pk, name="finance-leads", slack_channel_id="C999999999"
    )
    assert kept.status_code == 302
    group.refresh_from_db()
    assert group.slack_channel_id == "C999999999"
    assert group_secret_decrypt(group.slack_bot_token_encrypted) == TOKEN

    replaced = "xoxb-3333-4444-replacedTOKEN99"
    assert (
        save_group(
            admin, tenant, group=group.pk, name="finance-leads", slack_bot_token=replaced
        ).status_code
        == 302
    )
    group.refresh_from_db()
    assert group_secret_decrypt(group.slack_bot_token_encrypted) == replaced

    removed = save_group(admin, tenant, group=group.pk, name="finance-leads", remove_slack_app="on")
    assert removed.status_code == 302
    group.refresh_from_db()
    assert (group.slack_bot_token_encrypted, group.slack_channel_id) == ("", "")

    audits = [
        e["data"]
        for e in AuditEvent.objects.filter(kind="routing.group_saved").order_by("pk").values("data")
    ]
    assert [a.get("slack_app") for a in audits] == ["set", None, "replaced", "removed"]
    for secret in (TOKEN, replaced):
        assert secret not in json.dumps(audits)
        assert secret not in caplog.text
        assert all(secret not in str(record.__dict__) for record in caplog.records)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (
            {"slack_bot_token": "not-a-token-at-all", "slack_channel_id": CHANNEL},
            "starts with xoxb-",
        ),
        ({"slack_bot_token": TOKEN, "slack_channel_id": "#finance"}, "the Slack channel&#x27;s id"),
        ({"slack_bot_token": TOKEN}, "the id of the channel"),
        ({"slack_channel_id": CHANNEL}, "its bot token"),
        ({"slack_bot_token": "x" * 400, "slack_channel_id": CHANNEL}, "slack_bot_token"),
    ],
)
def test_a_bad_token_or_channel_is_a_form_error_never_a_500(
    tenant: Tenant, admin_user: Any, fields: dict[str, str], says: str
) -> None:
    admin = signed_in(admin_user)
    answer = save_group(admin, tenant, name="finance-leads", **fields)
    assert answer.status_code == 422
    page = answer.content.decode()
    assert says in page and "The group was not saved" in page
    assert fields.get("slack_bot_token", "none") not in page  # never echoed back
    assert not ReviewerGroup.objects.exists()


@pytest.mark.django_db
def test_only_the_tenants_admins_change_a_groups_slack_app_with_csrf(
    tenant: Tenant, admin_user: Any, reviewer: Any, other_tenant: Tenant
) -> None:
    from django.test import Client

    from tests.conftest import make_user

    group = reviewer_group_save(
        tenant=tenant,
        admin=admin_user,
        name="leads",
        member_ids=[],
        slack_bot_token=TOKEN,
        slack_channel_id=CHANNEL,
    ).group
    change = {"group": group.pk, "name": "leads", "remove_slack_app": "on"}
    assert save_group(signed_in(reviewer), tenant, **change).status_code == 403
    stranger = make_user("other-admin", other_tenant, "admin")
    assert save_group(signed_in(stranger), tenant, **change).status_code in (403, 404)
    # Its own tenant named, the group is still not found there.
    assert save_group(signed_in(stranger), other_tenant, **change).status_code == 404
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin_user)
    assert (
        strict.post("/manage/routing/groups", {"tenant": tenant.slug, **change}).status_code == 403
    )
    group.refresh_from_db()
    assert group.slack_channel_id == CHANNEL and group.slack_bot_token_encrypted


@pytest.mark.django_db
def test_a_failing_app_channel_is_shown_to_admins(
    runtime: Runtime, groups: Groups, slack_api: SlackApi, admin_user: Any
) -> None:
    slack_api.answers = [(200, {"ok": False, "error": "not_in_channel"}, {})]
    propose(runtime, 90000, "failing")
    drain()
    page = signed_in(admin_user).get("/manage/routing/").content.decode()
    assert "failing-channels" in page
    assert "Slack app: 1 failing in the last day (Slack: not_in_channel)" in page


@pytest.mark.django_db
def test_a_reply_waiting_for_its_thread_is_not_a_failing_channel(
    runtime: Runtime, groups: Groups, slack_api: SlackApi, admin_user: Any
) -> None:
    from approvals.models import Channel, NotificationDelivery
    from approvals.notifications.slack_app import WAITING

    propose(runtime, 90000, "waiting")
    drain()
    posted = NotificationDelivery.objects.filter(channel=Channel.SLACK_APP)
    assert posted.exists()
    # As a decision's reply is left while the request's message is still being retried.
    posted.update(state=NotificationDelivery.State.PENDING, last_error=WAITING)
    client = signed_in(admin_user)
    assert "failing-channels" not in client.get("/manage/routing/").content.decode()
    posted.update(last_error="Slack: ratelimited")  # a real failure still shows
    assert "failing-channels" in client.get("/manage/routing/").content.decode()


# --- the demo --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_demo_plays_slacks_web_api_under_debug_only_and_seeds_supports_app(
    settings: Any, tmp_path: Any, second_reviewer: Any
) -> None:
    import io

    from django.core.management import call_command
    from django.test import Client

    settings.EMAIL_FILE_PATH = str(tmp_path)
    url = "/_demo/outbox/slack-api/chat.postMessage"
    bearer = {"Authorization": "Bearer xoxb-demo-0000-not-a-real-token"}
    message = json.dumps({"channel": "CDEMOSUPPORT", "text": "*Review requested*"})
    settings.DEBUG = False
    assert Client().post(url, message, "application/json", headers=bearer).status_code == 404

    settings.DEBUG = True
    first = Client().post(url, message, "application/json", headers=bearer).json()
    assert first["ok"] is True and first["channel"] == "CDEMOSUPPORT" and first["ts"]
    reply = json.dumps({"channel": "CDEMOSUPPORT", "text": "*Decided*", "thread_ts": first["ts"]})
    assert Client().post(url, reply, "application/json", headers=bearer).json()["ok"] is True
    refused = Client().post(url, message, "application/json").json()
    assert refused == {"ok": False, "error": "not_authed"}
    page = signed_in(second_reviewer).get("/_demo/outbox").content.decode()
    assert f"reply in thread {first['ts']}" in page and "xoxb-" not in page

    settings.CALLBACK_ALLOW_HTTP = settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    settings.SLACK_API_URL = "http://127.0.0.1:8000/_demo/outbox/slack-api"
    call_command(
        "seed_demo",
        "--base-url",
        "http://127.0.0.1:8000",
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    support = ReviewerGroup.objects.get(name="support")
    assert support.slack_channel_id == "CDEMOSUPPORT" and support.slack_bot_token_encrypted
