from __future__ import annotations

from django.urls import path

from approvals.web import tokens as account_views
from approvals.web.bulk import bulk_review
from approvals.web.demo_outbox import demo_outbox, demo_outbox_catch, demo_slack_api
from approvals.web.home import manage, moved
from approvals.web.inbox import inbox, switch_tenant
from approvals.web.keys import key_created, key_deactivate, key_reactivate, keys, keys_create
from approvals.web.notifications import (
    notifications,
    notifications_mark_read,
    notifications_save,
)
from approvals.web.review import approve, edit, panel, reject, review, revoke
from approvals.web.review_health import review_health
from approvals.web.revocation_batches import revocations_batches
from approvals.web.revocations import (
    revocations,
    revocations_batch,
    revocations_revoke,
    revoke_fingerprint,
)
from approvals.web.routing import (
    routing,
    routing_group_save,
    routing_rule_remove_view,
    routing_rule_save_view,
)

app_name = "approvals"

urlpatterns = [
    path("reviews/", inbox, name="inbox"),
    path("reviews/bulk/", bulk_review, name="bulk"),
    path("reviews/<uuid:occurrence_id>/", review, name="review"),
    path("reviews/<uuid:occurrence_id>/panel", panel, name="panel"),
    path("reviews/<uuid:occurrence_id>/approve", approve, name="approve"),
    path("reviews/<uuid:occurrence_id>/reject", reject, name="reject"),
    path("reviews/<uuid:occurrence_id>/edit", edit, name="edit"),
    path("reviews/<uuid:occurrence_id>/revoke", revoke, name="revoke"),
    path("tenant/", switch_tenant, name="switch-tenant"),
    # A reviewer's personal access tokens (deciding through the API).
    path("account/tokens/", account_views.access_tokens, name="access-tokens"),
    path("account/tokens/create", account_views.access_token_create, name="access-token-create"),
    path(
        "account/tokens/<int:token_id>/revoke",
        account_views.access_token_revoke,
        name="access-token-revoke",
    ),
    # A reviewer's notifications: how each channel tells them, and what it told them.
    path("account/notifications/", notifications, name="notifications"),
    path("account/notifications/save", notifications_save, name="notifications-save"),
    path("account/notifications/read", notifications_mark_read, name="notifications-read"),
    # Admins: revocation (single and bulk) and runtime keys.
    # Admins: revocation (single and bulk) and runtime keys, under their own prefix (the
    # adapter credentials page, reconciliation's, sits beside them at manage/credentials/).
    path("manage/", manage, name="manage"),
    path("manage/revocations/", revocations, name="revocations"),
    path("manage/revocations/revoke", revocations_revoke, name="revocations-revoke"),
    path(
        "manage/revocations/fingerprint",
        revoke_fingerprint,
        name="revoke-fingerprint",
    ),
    path("manage/revocations/batches/", revocations_batches, name="revocations-batches"),
    path(
        "manage/revocations/batches/<uuid:batch_id>/",
        revocations_batch,
        name="revocations-batch",
    ),
    path("manage/review-health/", review_health, name="review-health"),
    path("manage/routing/", routing, name="routing"),
    path("manage/routing/groups", routing_group_save, name="routing-group-save"),
    path("manage/routing/rules", routing_rule_save_view, name="routing-rule-save"),
    path(
        "manage/routing/rules/<int:rule_id>/remove",
        routing_rule_remove_view,
        name="routing-rule-remove",
    ),
    path("manage/keys/", keys, name="keys"),
    path("manage/keys/create", keys_create, name="keys-create"),
    path("manage/keys/<int:key_id>/created", key_created, name="key-created"),
    path(
        "manage/keys/<int:key_id>/deactivate",
        key_deactivate,
        name="key-deactivate",
    ),
    path("manage/keys/<int:key_id>/reactivate", key_reactivate, name="key-reactivate"),
    # DEBUG only (bin/demo): the notifications sent, as a local catcher received them.
    path("_demo/outbox", demo_outbox, name="demo-outbox"),
    path("_demo/outbox/catch/<slug:channel>", demo_outbox_catch, name="demo-outbox-catch"),
    path("_demo/outbox/slack-api/chat.postMessage", demo_slack_api, name="demo-slack-api"),
    # Their addresses before the move: bookmarks and forms rendered earlier keep working.
    *(
        path(f"operations/{section}/{rest}", moved, {"new": f"/manage/{section}/"})
        for section in ("revocations", "keys", "credentials")
        for rest in ("", "<path:rest>")
    ),
]
