from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.config import ConfigError, load_config
from gateway.server import serve


class Command(BaseCommand):
    help = (
        "Serve the MCP gateway: the tools of the upstream MCP servers named in the config, "
        "every call that is not read-only approved in the console first. Streamable HTTP at "
        "http://HOST:PORT/mcp, or stdio with --stdio (docs/mcp-gateway.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--config", required=True, help="the gateway's TOML file")
        parser.add_argument(
            "--stdio", action="store_true", help="serve one client on stdin/stdout instead"
        )
        parser.add_argument("--port", type=int, help="override [gateway] port")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            config = load_config(options["config"])
        except ConfigError as exc:
            raise CommandError(f"{options['config']}: {exc}") from None
        if options["port"]:
            config = dataclasses.replace(config, port=options["port"])
        try:
            asyncio.run(serve(config, stdio=options["stdio"]))
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            pass
