"""A URLconf for tests/test_error_pages.py: the console's, plus one view that raises."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

from config.urls import handler403, handler404, handler500
from config.urls import urlpatterns as console_urlpatterns


class Broken(Exception):
    """Raised by the view below; its text must never reach the page."""


def broken(request: HttpRequest) -> HttpResponse:
    raise Broken("secret internals: agent said <script>x</script>")


urlpatterns = [
    path("reviews/broken/", broken),
    path("api/v1/broken", broken),
    *console_urlpatterns,
]

__all__ = ["handler403", "handler404", "handler500", "urlpatterns"]
