from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views import defaults

from approvals.api import api, error_response

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]


def handler404(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith("/api/"):
        return error_response("not_found", "No such API endpoint.", 404)
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return error_response("server_error", "The console hit an unexpected error.", 500)
    return defaults.server_error(request)
