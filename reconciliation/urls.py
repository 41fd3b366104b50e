from __future__ import annotations

from django.urls import path

from reconciliation import admin_views, investigation_views, views

app_name = "reconciliation"

urlpatterns = [
    path("operations/", views.queue, name="queue"),
    path("operations/credentials/", admin_views.credentials, name="credentials"),
    path("operations/occurrences/<uuid:occurrence_id>/", views.timeline, name="timeline"),
    path("investigations/", investigation_views.investigation, name="investigations"),
    path(
        "operations/commands/<uuid:command_id>/<slug:action>",
        views.command_action,
        name="command-action",
    ),
]
