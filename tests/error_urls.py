"""A URLconf for tests/test_error_pages.py and the accessibility walk: the console's, plus
a view that raises and one whose database is unavailable."""

from __future__ import annotations

from django.db import OperationalError
from django.http import HttpRequest, HttpResponse
from django.urls import path

from config.urls import handler403, handler404, handler500
from config.urls import urlpatterns as console_urlpatterns


class Broken(Exception):
    """Raised by the view below; its text must never reach the page."""


def broken(request: HttpRequest) -> HttpResponse:
    raise Broken("secret internals: agent said <script>x</script>")


def unavailable(request: HttpRequest) -> HttpResponse:
    raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")


urlpatterns = [
    path("reviews/broken/", broken),
    path("reviews/unavailable/", unavailable),
    path("api/v1/broken", broken),
    *console_urlpatterns,
]

__all__ = ["handler403", "handler404", "handler500", "urlpatterns"]
