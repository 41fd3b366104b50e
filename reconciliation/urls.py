from __future__ import annotations

from django.urls import path

from reconciliation.web import credentials as admin_views
from reconciliation.web import investigations as investigation_views
from reconciliation.web import views

app_name = "reconciliation"

urlpatterns = [
    path("operations/", views.queue, name="queue"),
    path("manage/credentials/", admin_views.credentials, name="credentials"),
    path("operations/occurrences/<uuid:occurrence_id>/", views.timeline, name="timeline"),
    path(
        "operations/occurrences/<uuid:occurrence_id>/<slug:move>",
        views.occurrence_take,
        name="take",
    ),
    path("investigations/", investigation_views.investigation, name="investigations"),
    path(
        "operations/commands/<uuid:command_id>/<slug:action>",
        views.command_action,
        name="command-action",
    ),
]
