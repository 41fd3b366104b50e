"""What the simulated agent proposes and how it misbehaves: its tools and their odds, the
customers, reasons and messages it draws from, and what it counts."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

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


SETTLED = frozenset(
    {
        console_models.Command.State.COMMITTED,
        console_models.Command.State.REJECTED,
        console_models.Command.State.OUTCOME_UNKNOWN,
        console_models.Command.State.RECONCILED,
        console_models.Command.State.COMPENSATED,
    }
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
