from __future__ import annotations

import sys

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.template import loader
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from approvals.api import api
from approvals.api.base import database_unavailable_response
from approvals.web.home import ConsoleLoginView
from approvals.web.home import home as role_home_view
from config import errors, health
from reconciliation.api import claims as claim_api
from reconciliation.api.commands import router as execution_router

# The execution endpoints belong to reconciliation, which sits above approvals: the
# composition happens here, so that approvals never imports it.
api.add_router("", claim_api.router)
api.add_router("", execution_router)

urlpatterns = [
    # For load balancers and Prometheus: no login, no session (config/health.py).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics_view, name="metrics"),
    # Browsers ask for /favicon.ico whatever the page says.
    path(
        "favicon.ico",
        RedirectView.as_view(url=static("console/favicon.svg"), permanent=True),
        name="favicon",
    ),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("accounts/login/", ConsoleLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Each role's own home: the inbox, the operations queue or the admin pages.
    path("", role_home_view, name="home"),
    path("", include("approvals.urls")),
    path("", include("reconciliation.urls")),
]


# The console's own error pages (config/errors.py), with DEBUG on too.
handler404 = errors.page_not_found
handler403 = errors.permission_denied


def handler500(request: HttpRequest) -> HttpResponse:
    # Django calls this while it handles the exception, so sys.exc_info() is that exception
    # (and logs it afterwards through django.request, with its traceback and trace id).
    if isinstance(sys.exc_info()[1], DATABASE_UNAVAILABLE):
        return handler503(request)
    return errors.server_error(request)


# What a lost or refused database connection raises. Every change is one transaction, so
# the database rolled back whatever the request had begun: nothing is half-written.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)


def handler503(request: HttpRequest) -> HttpResponse:
    """The database is unavailable: ``503 database_unavailable`` with ``Retry-After`` on
    the API, a plain page in the console. Rendered without the request's context (no
    session, no user, no tenant), so nothing here touches the database."""
    if request.path.startswith("/api/"):
        return database_unavailable_response()
    body = loader.get_template("503.html").render(
        {"retry_after": settings.DATABASE_RETRY_AFTER_SECONDS}
    )
    response = HttpResponse(body, status=503)
    response["Retry-After"] = str(settings.DATABASE_RETRY_AFTER_SECONDS)
    return response
