from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.access.runtime_keys import runtime_key_create
from approvals.models import RuntimeKey, Tenant


class Command(BaseCommand):
    help = "Create a runtime key for an agent runtime. The key is printed once, as the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["slug"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['slug']!r}.")
        try:
            name = RuntimeKey._meta.get_field("name").clean(options["name"].strip(), None)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        if RuntimeKey.objects.filter(tenant=tenant, name=name).exists():
            raise CommandError(f"Tenant {tenant.slug} already has a key named {name!r}.")
        key, raw = runtime_key_create(tenant=tenant, name=name)
        # The explanation goes to stderr, so stdout is the key alone: KEY=$(... create_runtime_key)
        self.stderr.write(f"Runtime key {key.name} for {tenant.slug}; it is shown only now:")
        self.stdout.write(raw)
