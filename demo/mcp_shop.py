"""A small MCP server, written with the ``mcp`` SDK, that the demo's gateway stands in front
of and the gateway's tests count the calls of. It needs no Django.

    python -m demo.mcp_shop                      # stdio
    python -m demo.mcp_shop --http 8300          # streamable HTTP at /mcp
    python -m demo.mcp_shop --ledger calls.jsonl # one JSON line per tool call

Its tools, one per contract the gateway derives from annotations:

- ``lookup_order`` (``readOnlyHint``): read-only, passes the gateway without a human.
- ``issue_refund`` (``idempotentHint``): idempotent with the key the gateway sends in
  ``_meta``; a second call with the same key returns the first refund. Refunds above
  1,000.00 are declined (``isError``).
- ``send_message`` (no hints): unsafe.

Every call, whatever its tool, is appended to the ledger before it answers: the tests
count the lines, which is the count of calls that reached this server.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

# The key of the gateway's idempotency key in a call's ``_meta`` (gateway.upstreams).
IDEMPOTENCY_META_KEY = "approval-console/idempotency-key"
DECLINE_ABOVE_MINOR = 100_000

_lock = threading.Lock()
_ledger_path = os.environ.get("MCP_SHOP_LEDGER", "")


def _record(tool: str, arguments: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """Append the call to the ledger and return the earlier calls (for the idempotency)."""
    if not _ledger_path:
        return []
    line = json.dumps({"tool": tool, "arguments": arguments, "idempotency_key": key})
    with _lock:
        earlier = []
        if os.path.exists(_ledger_path):
            with open(_ledger_path, encoding="utf-8") as ledger:
                earlier = [json.loads(row) for row in ledger if row.strip()]
        # O_APPEND: one write per line, whole, even with several servers on one ledger.
        fd = os.open(_ledger_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    return earlier


def _key(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    value = meta.get(IDEMPOTENCY_META_KEY, "")
    return value if isinstance(value, str) else ""


shop = MCPServer("demo-shop", instructions="A demo shop: orders, refunds and messages.")


@shop.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_order(order_id: str, ctx: Context) -> str:
    """Look up an order: its status and amount."""
    _record("lookup_order", {"order_id": order_id}, _key(ctx))
    return json.dumps({"order_id": order_id, "status": "delivered", "amount_minor": 4200})


@shop.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=True))
def issue_refund(order_id: str, amount_minor: int, currency: str, ctx: Context) -> str:
    """Refund part or all of an order (amount in minor units, e.g. cents)."""
    key = _key(ctx)
    earlier = _record(
        "issue_refund",
        {"order_id": order_id, "amount_minor": amount_minor, "currency": currency},
        key,
    )
    if amount_minor > DECLINE_ABOVE_MINOR:
        raise ToolError(f"declined: refunds above {DECLINE_ABOVE_MINOR} minor units need a call")
    first = next(
        (i for i, row in enumerate(earlier) if key and row.get("idempotency_key") == key), None
    )
    refund_id = f"re_{first if first is not None else len(earlier)}"
    return json.dumps({"refund_id": refund_id, "order_id": order_id, "replayed": first is not None})


@shop.tool()
def send_message(to: str, text: str, ctx: Context) -> str:
    """Send a message to a customer."""
    earlier = _record("send_message", {"to": to, "text": text}, _key(ctx))
    return json.dumps({"message_id": f"msg_{len(earlier)}", "to": to})


def main() -> None:
    global _ledger_path
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    parser.add_argument("--ledger", default=_ledger_path, help="append every call here")
    args = parser.parse_args()
    _ledger_path = args.ledger
    if args.http:
        shop.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        shop.run("stdio")


if __name__ == "__main__":
    main()
