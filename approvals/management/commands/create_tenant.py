from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.access.tenancy import tenant_create
from approvals.models import Tenant


class Command(BaseCommand):
    help = "Create a tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        slug, name = options["slug"], options["name"]
        try:
            # objects.create() runs no validators; the slug ends up in URLs and commands.
            Tenant._meta.get_field("slug").clean(slug, None)
            if name:
                Tenant._meta.get_field("name").clean(name, None)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        if Tenant.objects.filter(slug=slug).exists():
            raise CommandError(f"Tenant {slug!r} already exists.")
        tenant = tenant_create(slug=slug, name=name)
        self.stdout.write(f"Created tenant {tenant.slug}.")
