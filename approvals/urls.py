from __future__ import annotations

from django.urls import path

from approvals import views

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
]
