"""The simulated agent's loop: propose, wait for the people deciding in the browser, pick up
the token, claim, report the effect, and now and then misbehave on purpose."""

from __future__ import annotations

import json
import random
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TextIO

import httpx

from demo.agent.scenario import (
    CASE_CHALLENGE,
    CHAOS_KINDS,
    CONSOLE_TOOLS,
    CURRENCIES,
    CUSTOMERS,
    FAULT_MODES,
    ID_ALPHABET,
    LARGE_REFUND_REASONS,
    MESSAGES,
    REFUND_REASONS,
    REQUESTERS,
    SETTLED,
    TIMEOUT,
    TOOL_BAG,
    WATCH_STEPS,
    Bag,
    KeyRefused,
    Request,
    Stats,
    Unreachable,
    money,
    redact,
    short,
)


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
