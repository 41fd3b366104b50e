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

import json
import os
import random
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

import httpx
from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals import models as console_models

# Explicit timeouts: connecting is quick or the console is down; a claim or a token pickup
# answers in milliseconds, so ten seconds means something is wrong.
TIMEOUT = httpx.Timeout(connect=3.0, read=10.0, write=10.0, pool=3.0)

# A shuffled bag of tools, refilled when empty: every kind appears in every eight
# proposals, refunds most often.
TOOL_BAG = (
    "issue_refund",
    "issue_refund",
    "issue_refund",
    "send_message",
    "send_message",
    "lookup_order",
    "close_case",
    "close_case",
)
# Tools whose contract names an adapter: the console executes them (the claim's
# ``executed_by`` says so; this only decides whether a sandbox fault can matter).
CONSOLE_TOOLS = frozenset({"issue_refund", "send_message"})
CHAOS_KINDS = ("redeliver", "replay", "fault")
FAULT_MODES = (
    "unauthorized",
    "timeout_after_effect",
    "reset_after_effect",
    "declined",
    "unavailable",
)
# Effects that no longer change by themselves.
State = console_models.Command.State
SETTLED = frozenset(
    {State.COMMITTED, State.REJECTED, State.OUTCOME_UNKNOWN, State.RECONCILED, State.COMPENSATED}
)
# How many steps a console-executed command is watched before the agent stops asking.
WATCH_STEPS = 90

CUSTOMERS = (
    ("Dana Whitfield", "dana.whitfield@example.com"),
    ("Marco Rossi", "marco.rossi@example.it"),
    ("Aiko Tanaka", "aiko.tanaka@example.jp"),
    ("Priya Nair", "priya.nair@example.in"),
    ("Lukas Becker", "lukas.becker@example.de"),
    ("Sofia Alves", "sofia.alves@example.pt"),
    ("Tom O'Neill", "tom.oneill@example.ie"),
    ("Chloé Martin", "chloe.martin@example.fr"),
)
# The people the agent acts for: never a demo reviewer, who could not approve their own.
REQUESTERS = ("alice", "bob", "carol", "dave")
CURRENCIES = ("EUR", "EUR", "EUR", "USD", "USD", "GBP")
REFUND_REASONS = (
    ("Parcel lost in transit", "Tracking shows the parcel lost at the carrier's hub."),
    ("Order arrived damaged", "The customer sent photos of the crushed box."),
    ("Duplicate charge", "The card was charged twice for the same order."),
    ("Item out of stock", "The warehouse cancelled a line that was already paid."),
    ("Late delivery compensation", "Delivery was nine days late; policy allows 20 % back."),
    ("Wrong size sent", "The customer returned the item and the return was scanned."),
    ("Subscription cancelled", "Cancelled within the 14-day withdrawal period."),
)
LARGE_REFUND_REASONS = (
    ("Annual plan charged twice", "The annual plan renewed twice on the same day."),
    ("Bulk order returned", "A business customer returned a whole pallet, unopened."),
    ("Laptop never delivered", "The carrier confirmed the laptop was stolen in transit."),
)
MESSAGES = (
    (
        "Your refund is on its way",
        "Hi {first},\n\nWe refunded {amount} to your card. It takes 3-5 working days to "
        "appear.\n\nBest,\nSupport",
    ),
    (
        "About your order {order}",
        "Hi {first},\n\nWe are sorry your order {order} did not arrive as it should. A "
        "replacement ships today.\n\nBest,\nSupport",
    ),
    (
        "We received your return",
        "Hi {first},\n\nYour return for order {order} arrived at our warehouse. We will let "
        "you know when it has been checked.\n\nBest,\nSupport",
    ),
)
ID_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789"
CASE_CHALLENGE = 'Bearer realm="cases", error="invalid_token", error_description="expired"'

_SECRET = re.compile(r"\b(apv|rk)_[A-Za-z0-9_\-]+")


def redact(text: str) -> str:
    """Anything that looks like a token or a runtime key, blanked: a line that quotes a
    server's message must not leak a secret into a log."""
    return _SECRET.sub(lambda m: f"{m.group(1)}_<redacted>", text)


def money(amount_minor: int, currency: str) -> str:
    return f"{amount_minor // 100}.{amount_minor % 100:02d} {currency}"


def short(identifier: str) -> str:
    """The first block of a UUID: enough to find it on the page."""
    return identifier.split("-", 1)[0]


class Unreachable(Exception):
    """The console or the sandbox could not be reached (or failed): retry at the next step."""

    def __init__(self, target: str, why: str) -> None:
        super().__init__(f"{target}: {why}")
        self.target = target
        self.why = why


class KeyRefused(Exception):
    """The console refused the runtime key (revoked, or never valid): nothing will work."""


class Bag:
    """Draw without replacement from a shuffled copy, refilled when empty: over a few
    draws every item appears, in a seeded but unpredictable order."""

    def __init__(self, items: Sequence[str], rng: random.Random) -> None:
        self.items = tuple(items)
        self.rng = rng
        self.left: list[str] = []

    def draw(self) -> str:
        if not self.left:
            self.left = list(self.items)
            self.rng.shuffle(self.left)
        return self.left.pop()


@dataclass(eq=False)
class Request:
    """One proposal the agent made and follows until it is done."""

    occurrence_id: str
    tool: str
    summary: str
    client_ref: str
    # review → token → claim → report (runtime) | watch (console) → done
    stage: str = "review"
    action: dict[str, Any] = field(default_factory=dict)
    version: int = 1
    # Held only between the pickup and the claim (and a planned replay); never printed.
    token: str | None = field(default=None, repr=False)
    fingerprint: str = ""
    chaos: str | None = None
    execution_id: str = ""
    claim_attempts: int = 0
    command_id: str = ""
    executed_by: str = ""
    watched: int = 0


@dataclass
class Stats:
    proposed: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def line(self) -> str:
        tools = ", ".join(f"{k}={v}" for k, v in sorted(self.proposed.items())) or "none"
        rest = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "nothing else"
        return f"proposed {tools}; {rest}"


class Agent:
    """The simulated runtime. ``step()`` advances every open request once and maybe
    proposes a new one; ``run()`` repeats it until stopped or out of steps."""

    def __init__(
        self,
        *,
        url: str,
        key: str,
        sandbox: str | None = None,
        interval: float = 4.0,
        seed: int | None = None,
        chaos: float = 0.3,
        max_open: int = 6,
        out: TextIO,
        stop: threading.Event | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.sandbox = sandbox.rstrip("/") if sandbox else None
        self.interval = interval
        # The demo's choices, reproducible with --seed; nothing secret comes from it.
        self.rng = random.Random(seed)  # noqa: S311
        self.chaos = chaos
        self.max_open = max_open
        self.out = out
        self.stop = stop or threading.Event()
        self.open: list[Request] = []
        self.stats = Stats()
        self.tools = Bag(TOOL_BAG, self.rng)
        self.chaos_bag = Bag(CHAOS_KINDS, self.rng)
        self.faults = Bag(FAULT_MODES, self.rng)
        # Names of this run: client_refs and execution ids must not collide with an
        # earlier run's against the same database, whatever the seed.
        self.session = secrets.token_hex(3)
        self.counter = 0
        self.unsent: dict[str, Any] | None = None
        self.down: set[str] = set()
        self.key_refused = False
        self.api = httpx.Client(
            base_url=self.url,
            timeout=TIMEOUT,
            headers={"Authorization": f"Bearer {key}", "User-Agent": "simulate-agent/1"},
        )
        self.control = httpx.Client(timeout=TIMEOUT)

    # -- output and HTTP -------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.out.write(f"{time.strftime('%H:%M:%S')} {redact(text)}\n")
        self.out.flush()

    def _send(
        self, client: httpx.Client, target: str, method: str, path: str, body: Any = None
    ) -> httpx.Response:
        try:
            response = client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise Unreachable(target, type(exc).__name__) from None
        if response.status_code >= 500:
            raise Unreachable(target, f"it answered {response.status_code}")
        if target in self.down:
            self.down.discard(target)
            self.say(f"{target} is reachable again")
        return response

    def call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        response = self._send(self.api, "console", method, f"/api/v1{path}", body)
        if response.status_code == 401:
            raise KeyRefused
        return response

    def _unreachable(self, exc: Unreachable) -> None:
        if exc.target not in self.down:
            self.down.add(exc.target)
            where = self.url if exc.target == "console" else self.sandbox
            problem = "failing" if exc.why.startswith("it answered") else "unreachable"
            self.say(
                f"{exc.target} {problem} at {where} ({exc.why}); retrying every {self.interval:g} s"
            )

    @staticmethod
    def _error(response: httpx.Response) -> tuple[str, str]:
        try:
            body = response.json()
        except ValueError:
            return "", response.reason_phrase
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            return str(error.get("code", "")), str(error.get("message", ""))
        return "", response.reason_phrase

    # -- the loop --------------------------------------------------------------------------

    def run(self, steps: int | None = None) -> int:
        """Step until stopped or ``steps`` are done; return the number of steps made."""
        done = 0
        self.say(
            f"agent {self.session} for {self.url}"
            + (f", sandbox {self.sandbox}" if self.sandbox else ", no sandbox")
            + f", a step every {self.interval:g} s"
            + (f", {steps} steps" if steps is not None else "")
        )
        while not self.stop.is_set() and (steps is None or done < steps):
            self.step()
            done += 1
            if steps is None or done < steps:
                self.stop.wait(self.interval)
        self.say(f"stopped after {done} steps: {self.stats.line()}")
        return done

    def step(self) -> None:
        try:
            for request in list(self.open):
                if self.stop.is_set():
                    return
                try:
                    self.advance(request)
                except (ValueError, KeyError, TypeError) as exc:
                    # An answer of a shape this agent does not know: drop the request, go on.
                    self.say(f"{request.summary}: unexpected answer ({exc!r}); dropping it")
                    self.stats.add("unexpected_answer")
                    self.drop(request)
            waiting = sum(1 for r in self.open if r.stage == "review")
            if self.unsent is not None:
                self.propose(self.unsent)
            elif waiting < self.max_open and self.rng.random() < 0.6:
                self.propose(self.invent())
        except Unreachable as exc:
            self._unreachable(exc)
        except KeyRefused:
            self.say("the console refused the runtime key (401): revoked or wrong; stopping")
            self.key_refused = True
            self.stop.set()

    def close(self) -> None:
        self.api.close()
        self.control.close()

    # -- proposing -------------------------------------------------------------------------

    def invent(self) -> dict[str, Any]:
        """A new, plausible tool call."""
        rng = self.rng
        self.counter += 1
        tool = self.tools.draw()
        name, email = rng.choice(CUSTOMERS)
        order = str(rng.randint(1000, 9999))
        run_id = f"run-support-{order}"
        requested_by = rng.choice(REQUESTERS)
        arguments: dict[str, Any]
        if tool == "issue_refund":
            currency = rng.choice(CURRENCIES)
            if rng.random() < 0.2:
                amount = rng.randint(520, 2400) * 100 + rng.choice((0, 0, 50, 99))
                title, why = rng.choice(LARGE_REFUND_REASONS)
            else:
                amount = rng.choice((rng.randint(5, 120), rng.randint(20, 480))) * 100
                amount += rng.choice((0, 0, 0, 50, 90, 99))
                title, why = rng.choice(REFUND_REASONS)
            arguments = {
                "payment_id": "pay_" + "".join(rng.choices(ID_ALPHABET, k=8)),
                "amount_minor": amount,
                "currency": currency,
                "reason": f"{title} (order {order})",
            }
            summary = f"refund {money(amount, currency)} {arguments['payment_id']}"
            reason = f"{why} {name} asked for a refund of order {order}."
        elif tool == "send_message":
            subject, body = rng.choice(MESSAGES)
            amount = rng.randint(10, 300) * 100
            first = name.split()[0]
            arguments = {
                "to": email,
                "subject": subject.format(order=order),
                "body": body.format(first=first, order=order, amount=money(amount, "EUR")),
            }
            summary = f"message to {email} ({arguments['subject']!r})"
            reason = f"Tell {first} what happened with order {order}."
        elif tool == "lookup_order":
            arguments = {"order_id": order}
            summary = f"lookup of order {order}"
            reason = f"Check the status of order {order} before answering {name}."
        else:
            case = f"case_{rng.randint(10000, 99999)}"
            arguments = {"case_id": case}
            summary = f"close_case {case}"
            reason = f"{name}'s issue with order {order} is resolved; close the case."
        return {
            "body": {
                "tool": tool,
                "arguments": arguments,
                "run_id": run_id,
                "reason": reason,
                "requested_by": requested_by,
                "client_ref": f"sim-{self.session}-{self.counter:04d}-{tool}",
            },
            "summary": summary,
        }

    def propose(self, plan: dict[str, Any]) -> None:
        # Kept until the console answers: a proposal lost to a network failure is sent
        # again with the same client_ref, which the console turns into the same occurrence.
        self.unsent = plan
        body, summary = plan["body"], plan["summary"]
        response = self.call("POST", "/occurrences", body)
        self.unsent = None
        if response.status_code not in (200, 201):
            code, message = self._error(response)
            self.say(f"proposal of {summary} refused: {response.status_code} {code} {message}")
            self.stats.add("proposal_refused")
            return
        answer = response.json()
        occurrence_id, status = answer["occurrence_id"], answer["status"]
        tool = body["tool"]
        self.stats.proposed[tool] = self.stats.proposed.get(tool, 0) + 1
        self.say(f"proposed {summary} → occurrence {short(occurrence_id)} ({status})")
        self.open.append(
            Request(
                occurrence_id=occurrence_id,
                tool=tool,
                summary=summary,
                client_ref=body["client_ref"],
            )
        )
        if self.rng.random() < 0.1:
            # A retried proposal (the agent's own retry after a timeout): same occurrence.
            again = self.call("POST", "/occurrences", body)
            same = again.status_code == 200 and again.json()["occurrence_id"] == occurrence_id
            self.say(
                f"re-sent proposal {body['client_ref']} → "
                + ("same occurrence (200)" if same else f"{again.status_code}")
            )
            self.stats.add("proposal_resent")

    # -- following a request ---------------------------------------------------------------

    def drop(self, request: Request) -> None:
        request.token = None
        request.stage = "done"
        if request in self.open:
            self.open.remove(request)

    def advance(self, request: Request) -> None:
        if request.stage == "review":
            self.review(request)
        if request.stage == "token":
            self.pick_up(request)
        if request.stage == "claim":
            self.claim(request)
        if request.stage == "report":
            self.report(request)
        elif request.stage == "watch":
            self.watch(request)

    def review(self, request: Request) -> None:
        response = self.call("GET", f"/occurrences/{request.occurrence_id}")
        if response.status_code == 404:
            self.say(f"{request.summary}: occurrence {short(request.occurrence_id)} is gone")
            self.drop(request)
            return
        occurrence = response.json()
        status = occurrence["status"]
        if status == "pending_review":
            return
        if status == "auto_admitted":
            # Read-only and admitted by policy: the runtime reads the order itself.
            self.say(f"{request.summary}: auto-admitted (read-only), done without a token")
            self.stats.add("auto_admitted")
            self.drop(request)
        elif status == "rejected":
            self.say(f"{request.summary} rejected: {occurrence['rejection_reason']}")
            self.stats.add("rejected")
            self.drop(request)
        elif status == "approved":
            proposal = occurrence["proposal"]
            request.action = json.loads(proposal["canonical_action"])
            request.version = int(proposal["version"])
            request.stage = "token"
        else:
            self.say(f"{request.summary}: the occurrence is {status}; nothing left to do")
            self.drop(request)

    def pick_up(self, request: Request) -> None:
        response = self.call("POST", f"/occurrences/{request.occurrence_id}/token")
        if response.status_code != 200:
            code, message = self._error(response)
            if code == "not_approved":
                # Edited after the approval: the new version needs its own review.
                request.stage = "review"
                return
            self.say(
                f"token for {request.summary} refused: {code or response.status_code} {message}"
            )
            self.stats.add(f"token_{code or response.status_code}")
            self.drop(request)
            return
        answer = response.json()
        request.token = answer["token"]
        request.fingerprint = answer["fingerprint"]
        edited = f", version {request.version} as edited" if request.version > 1 else ""
        self.say(f"approved: {request.summary}{edited}; picked up token {request.fingerprint}")
        self.stats.add("tokens")
        request.chaos = self.draw_chaos(request.tool)
        self.counter += 1
        request.execution_id = f"exec-{self.session}-{self.counter:04d}"
        request.stage = "claim"

    def draw_chaos(self, tool: str) -> str | None:
        if self.rng.random() >= self.chaos:
            return None
        for _ in range(len(CHAOS_KINDS)):
            kind = self.chaos_bag.draw()
            if kind != "fault" or (tool in CONSOLE_TOOLS and self.sandbox):
                return kind
        return None

    def _claim(self, request: Request, execution_id: str) -> httpx.Response:
        assert request.token is not None
        body = {"token": request.token, "action": request.action, "execution_id": execution_id}
        return self.call("POST", "/claims", body)

    def claim(self, request: Request) -> None:
        if request.chaos == "fault" and request.claim_attempts == 0:
            self.arm_fault(request)
        request.claim_attempts += 1
        response = self._claim(request, request.execution_id)
        answer = (
            response.json()
            if response.headers.get("content-type", "").startswith("application/json")
            else {}
        )
        decision = answer.get("decision", "")
        if response.status_code != 200:
            code, _ = self._error(response)
            what = decision or code or str(response.status_code)
            self.say(
                f"claimed {request.fingerprint} for {request.summary} → {what} "
                f"({response.status_code})"
            )
            self.stats.add(f"claim_{what}")
            self.drop(request)
            return
        request.command_id = answer["command_id"]
        request.executed_by = answer["executed_by"]
        retried = " after a lost answer" if request.claim_attempts > 1 else ""
        self.say(
            f"claimed {request.fingerprint} as {request.execution_id}{retried} → {decision}, "
            f"executed by {request.executed_by} (command {short(request.command_id)})"
        )
        self.stats.add("claims")
        if request.chaos == "redeliver":
            self.redeliver(request)
        elif request.chaos == "replay":
            self.replay(request)
        request.token = None
        request.stage = "report" if request.executed_by == "runtime" else "watch"

    def arm_fault(self, request: Request) -> None:
        mode = self.faults.draw()
        try:
            response = self._send(
                self.control,
                "sandbox",
                "POST",
                f"{self.sandbox}/_sandbox/faults",
                {"mode": mode, "times": 1},
            )
        except Unreachable as exc:
            self._unreachable(exc)
            return
        if response.status_code == 200:
            # The fault hits whichever write reaches the sandbox next: usually this one.
            self.say(
                f"sandbox fault {mode} armed for its next write, then claiming {request.summary}"
            )
            self.stats.add(f"fault_{mode}")
        else:
            self.say(f"sandbox refused fault {mode}: {response.status_code}")

    def redeliver(self, request: Request) -> None:
        """The queue delivers the same claim twice: same execution, same command."""
        response = self._claim(request, request.execution_id)
        decision = response.json().get("decision", response.status_code)
        same = response.json().get("command_id") == request.command_id
        self.say(
            f"redelivered claim {request.execution_id} → {decision} ({response.status_code})"
            + (", same command" if same else "")
        )
        self.stats.add(f"redelivered_{decision}")

    def replay(self, request: Request) -> None:
        """Another execution presents a token that is already consumed."""
        other = f"{request.execution_id}-other"
        response = self._claim(request, other)
        decision = response.json().get("decision", response.status_code)
        self.say(
            f"replayed token {request.fingerprint} from {other} → {decision} "
            f"({response.status_code})"
        )
        self.stats.add(f"replay_{decision}")

    def report(self, request: Request) -> None:
        """The runtime runs the tool itself, then tells the console what happened."""
        roll = self.rng.random()
        body: dict[str, Any] = {"execution_id": request.execution_id}
        if roll < 0.72:
            body |= {"outcome": "committed", "receipt": f"cls_{self.rng.getrandbits(40):010x}"}
        elif roll < 0.86:
            body |= {
                "outcome": "outcome_unknown",
                "detail": "The case service timed out after 10 s; the case may be closed.",
            }
        else:
            body |= {
                "outcome": "interrupted",
                "detail": "The case service refused the runtime's credentials.",
                "challenges": [CASE_CHALLENGE],
            }
        response = self.call("POST", f"/commands/{request.command_id}/effect", body)
        if response.status_code == 200:
            effect = response.json()["effect_state"]
            extra = body.get("receipt") or body.get("detail") or ""
            self.say(
                f"reported {request.summary} → {body['outcome']} (effect {effect})"
                + (f": {extra}" if extra else "")
            )
            self.stats.add(f"reported_{body['outcome']}")
        else:
            code, message = self._error(response)
            self.say(
                f"report for {request.summary} refused: {response.status_code} {code} {message}"
            )
            self.stats.add("report_refused")
        self.drop(request)

    def watch(self, request: Request) -> None:
        """Follow a console-executed command until its effect settles."""
        request.watched += 1
        response = self.call("GET", f"/commands/{request.command_id}")
        if response.status_code != 200:
            self.drop(request)
            return
        command = response.json()
        effect = command["effect_state"]
        if effect in SETTLED:
            calls = command["invocation_count"]
            receipts = [i["receipt"] for i in command["invocations"] if i.get("receipt")]
            details = [i["detail"] for i in command["invocations"] if i.get("detail")]
            note = f"receipt {receipts[-1]}" if receipts else (details[-1] if details else "")
            for interruption in command.get("interruptions", []):
                note = "interrupted: " + "; ".join(interruption["challenges"])
            self.say(
                f"{request.summary}: {effect} after {calls} "
                f"call{'s' if calls != 1 else ''}" + (f", {note}" if note else "")
            )
            self.stats.add(f"effect_{effect}")
            self.drop(request)
        elif request.watched >= WATCH_STEPS:
            self.say(f"{request.summary}: still {effect}; no longer watching it")
            self.drop(request)


@contextmanager
def stop_on_signals(stop: threading.Event, say: Callable[[str], None]) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop``; a second one ends the process at once."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise SystemExit(128 + signum)
        stop.set()
        say(f"{signal.Signals(signum).name}: stopping after the current request")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


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
