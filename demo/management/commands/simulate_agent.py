"""A simulated agent runtime for the demo, talking to the console's real agent API.

It proposes refunds (now and then above 500.00, which need two approvers), messages,
order lookups and ``close_case`` calls, waits while people decide in the browser, picks up
each approval's token once, claims it under an execution id of its own and, for the tools
the runtime executes itself, reports the effect. Now and then it misbehaves on purpose, the
way real runtimes and queues do: it redelivers a claim (``duplicate_delivery``), replays a
token from another execution (``replayed``), or arms a sandbox fault before a claim, so that
someone watching the console sees every state.

It is only an HTTP client: it never opens the database, and a raw token or runtime key is
never printed (tokens are named by the fingerprint the console returns). One short line per
action goes to stdout. A console or sandbox that is down is reported once and retried at the
next step; Ctrl-C or SIGTERM stops it after the request in flight.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo.agent.runner import Agent, stop_on_signals


class Command(BaseCommand):
    help = (
        "Simulate an agent runtime against the console's agent API: propose tool calls, "
        "wait for decisions, pick up tokens, claim, report effects, and misbehave now and "
        "then (redelivery, replay, sandbox faults). Prints one line per action; never a token."
    )
    # An HTTP client only: it needs no database and no checks.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="The console.")
        parser.add_argument(
            "--key",
            default=os.environ.get("AGENT_KEY", ""),
            help="The runtime key (rk_...); default $AGENT_KEY, which keeps it out of `ps`.",
        )
        parser.add_argument("--interval", type=float, default=4.0, help="Seconds per step.")
        parser.add_argument("--steps", type=int, default=None, help="Stop after N steps.")
        parser.add_argument(
            "--sandbox",
            default=None,
            help="The sandbox payments service, to arm faults (e.g. http://127.0.0.1:8100).",
        )
        parser.add_argument("--seed", type=int, default=None, help="Seed of the choices.")
        parser.add_argument(
            "--chaos",
            type=float,
            default=0.3,
            help="Share of claims that misbehave on purpose (0 to 1, default 0.3).",
        )
        parser.add_argument(
            "--max-open",
            type=int,
            default=6,
            help="Stop proposing while this many requests wait for review.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["key"].strip()
        if not key.startswith("rk_"):
            raise CommandError("Give the runtime key with --key rk_... or $AGENT_KEY.")
        if not 0 <= options["chaos"] <= 1:
            raise CommandError("--chaos is between 0 and 1.")
        stop = threading.Event()
        agent = Agent(
            url=options["url"],
            key=key,
            sandbox=options["sandbox"],
            interval=options["interval"],
            seed=options["seed"],
            chaos=options["chaos"],
            max_open=options["max_open"],
            out=self.stdout,  # type: ignore[arg-type]
            stop=stop,
        )
        try:
            with stop_on_signals(stop, agent.say):
                agent.run(options["steps"])
        except KeyboardInterrupt:
            agent.say("interrupted")
        finally:
            agent.close()
        if agent.key_refused:
            raise CommandError("The console refused the runtime key.")
