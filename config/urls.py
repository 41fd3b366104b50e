from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views import defaults
from django.views.generic import RedirectView

from approvals.api import api, error_response

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", RedirectView.as_view(pattern_name="approvals:inbox"), name="home"),
    path("", include("approvals.urls")),
]


def handler404(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith("/api/"):
        return error_response("not_found", "No such API endpoint.", 404)
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return error_response("server_error", "The console hit an unexpected error.", 500)
    return defaults.server_error(request)
