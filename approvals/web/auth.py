"""Sign-in throttling: django-axes, configured in ``config.settings`` (``AXES_*``).

After ``AXES_FAILURE_LIMIT`` (5) failed sign-ins for one username from one address, that
username is locked out from that address for ``AXES_COOLOFF_TIME`` (15 minutes), counted
again from each further failure; a right password during the lockout does not sign in. The
attempts are rows in the database (axes' database handler), so every web process sees the
same count. An admin lifts a lockout early with ``manage.py axes_reset_username <name>``.
"""

from __future__ import annotations

import math
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_client_username, get_cool_off, get_failure_limit
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse


class LoginThrottleBackend(AxesStandaloneBackend):
    """Axes' lockout check, first in ``AUTHENTICATION_BACKENDS``.

    Axes refuses an ``authenticate()`` call without a request. Every sign-in that comes
    over HTTP has one (the console's and the admin's login views pass it); only code inside
    the process calls without one (Django's test client ``login()``, a shell), and no
    client can reach that path, so here it is left to the next backend instead."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> None:
        if request is not None:
            # Returns nothing; raises PermissionDenied for a locked-out username and address.
            super().authenticate(request, username=username, password=password, **kwargs)
        return None


def lockout_response(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the sign-in page's lockout message, 429 with
    ``Retry-After``. django-axes before 8.1 calls it as ``(request, credentials)``."""
    if isinstance(original_response, dict) and credentials is None:
        credentials, original_response = original_response, None
    cool_off = get_cool_off(request)
    seconds = int(cool_off.total_seconds()) if cool_off else 0
    response = TemplateResponse(
        request,
        "registration/locked_out.html",
        {
            "username": get_client_username(request, credentials) or "",
            "failure_limit": get_failure_limit(request, credentials),
            "cooloff_minutes": math.ceil(seconds / 60),
        },
        status=429,
    )
    if seconds:
        response["Retry-After"] = str(seconds)
    return response.render()
