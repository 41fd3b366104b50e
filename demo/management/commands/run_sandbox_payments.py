from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from demo.sandbox import (
    DEFAULT_API_KEY,
    DEFAULT_HOLD_SECONDS,
    DEFAULT_WEBHOOK_SECRET,
    default_data_path,
    serve,
)


class Command(BaseCommand):
    help = (
        "Serve the sandbox payments service on 127.0.0.1 until SIGTERM/SIGINT. "
        'Prints one line, "sandbox payments on http://127.0.0.1:PORT", once it listens.'
    )
    # The sandbox touches no database and no model: starting it must not depend on them.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8100, help="0 picks a free port.")
        parser.add_argument(
            "--data",
            type=Path,
            default=default_data_path(),
            help="JSON file holding the sandbox's state across restarts.",
        )
        parser.add_argument(
            "--api-key",
            default=os.environ.get("PAYMENTS_API_KEY", DEFAULT_API_KEY),
            help="Bearer key /v1/refunds accepts (default: $PAYMENTS_API_KEY or sk_sandbox).",
        )
        parser.add_argument(
            "--webhook-secret",
            default=os.environ.get("MESSAGES_WEBHOOK_SECRET") or DEFAULT_WEBHOOK_SECRET,
            help="The secret /v1/messages verifies each message's Standard Webhooks "
            "signature with (default: $MESSAGES_WEBHOOK_SECRET or whsec_sandbox).",
        )
        parser.add_argument(
            "--hold-seconds",
            type=float,
            default=DEFAULT_HOLD_SECONDS,
            help="How long the timeout_after_effect fault holds an answer.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def announce(url: str) -> None:
            # Flushed at once: whoever started the process waits for this line to learn the port.
            self.stdout.write(f"sandbox payments on {url}")
            self.stdout.flush()

        serve(
            port=options["port"],
            data_path=options["data"],
            api_key=options["api_key"],
            hold_seconds=options["hold_seconds"],
            webhook_secret=options["webhook_secret"],
            on_listening=announce,
        )
