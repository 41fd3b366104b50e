"""The configuration package as an app of its own: what it registers with Django."""

from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "config"
    label = "console"
    verbose_name = "Approval console configuration"

    def ready(self) -> None:
        # Registers the console's system checks (manage.py check, check --deploy).
        from config import checks  # noqa: F401
