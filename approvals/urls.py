from __future__ import annotations

from django.urls import path

from approvals import account_views, admin_views, views

app_name = "approvals"

urlpatterns = [
    path("reviews/", views.inbox, name="inbox"),
    path("reviews/<uuid:occurrence_id>/", views.review, name="review"),
    path("reviews/<uuid:occurrence_id>/panel", views.panel, name="panel"),
    path("reviews/<uuid:occurrence_id>/approve", views.approve, name="approve"),
    path("reviews/<uuid:occurrence_id>/reject", views.reject, name="reject"),
    path("reviews/<uuid:occurrence_id>/edit", views.edit, name="edit"),
    path("reviews/<uuid:occurrence_id>/revoke", views.revoke, name="revoke"),
    path("tenant/", views.switch_tenant, name="switch-tenant"),
    # A reviewer's personal access tokens (deciding through the API).
    path("account/tokens/", account_views.access_tokens, name="access-tokens"),
    path("account/tokens/create", account_views.access_token_create, name="access-token-create"),
    path(
        "account/tokens/<int:token_id>/revoke",
        account_views.access_token_revoke,
        name="access-token-revoke",
    ),
    # Admins: revocation (single and bulk) and runtime keys.
    path("operations/revocations/", admin_views.revocations, name="revocations"),
    path(
        "operations/revocations/revoke", admin_views.revocations_revoke, name="revocations-revoke"
    ),
    path(
        "operations/revocations/fingerprint",
        admin_views.revoke_fingerprint,
        name="revoke-fingerprint",
    ),
    path(
        "operations/revocations/batches/<uuid:batch_id>/",
        admin_views.revocations_batch,
        name="revocations-batch",
    ),
    path("operations/keys/", admin_views.keys, name="keys"),
    path("operations/keys/create", admin_views.keys_create, name="keys-create"),
    path(
        "operations/keys/<int:key_id>/deactivate",
        admin_views.key_deactivate,
        name="key-deactivate",
    ),
]
