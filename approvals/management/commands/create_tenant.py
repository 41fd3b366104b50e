from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals import services
from approvals.models import Tenant


class Command(BaseCommand):
    help = "Create a tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        if Tenant.objects.filter(slug=options["slug"]).exists():
            raise CommandError(f"Tenant {options['slug']!r} already exists.")
        tenant = services.tenant_create(slug=options["slug"], name=options["name"])
        self.stdout.write(f"Created tenant {tenant.slug}.")
