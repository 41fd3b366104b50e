from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from reconciliation.credentials import stored_secrets_reencrypt


class Command(BaseCommand):
    help = (
        "Encrypt every stored secret (callback signing secrets, adapter credentials, webhook "
        "and escalation secrets) again with the current SECRET_KEY, after a rotation moved "
        "the old key into SECRET_KEY_FALLBACKS. Exits 1 if a secret no key reads was found."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        result = stored_secrets_reencrypt()
        for label, moved in result.moved.items():
            self.stdout.write(f"{label}: {moved} re-encrypted")
            if result.unreadable[label]:
                self.stderr.write(
                    f"{label}: {result.unreadable[label]} unreadable with SECRET_KEY and "
                    "SECRET_KEY_FALLBACKS (encrypted under a key no longer configured): "
                    "left as they are; enter those secrets again"
                )
        if any(result.unreadable.values()):
            raise CommandError("some stored secrets could not be read", returncode=1)
