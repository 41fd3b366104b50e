"""The gateway's connections to its upstream MCP servers (a stdio command it starts, or a
streamable HTTP URL), each an ``mcp.ClientSession`` held for the gateway's life; and what an
upstream's answer means for the effect: its result's digest is the receipt, ``isError`` a
rejection, a transport failure after the request was sent an unknown outcome."""

from __future__ import annotations

import hashlib
import logging
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import rfc8785
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client, types
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client

from approvals.vocabulary import ReportedOutcome
from gateway.config import Upstream

logger = logging.getLogger(__name__)

# Where a gated call carries the command's idempotency key to the upstream (``_meta``): the
# same key on every delivery of one command, so an upstream that honours it runs it once.
IDEMPOTENCY_META_KEY = "approval-console/idempotency-key"
# An upstream call that has not answered by then is of unknown outcome (never re-sent).
CALL_TIMEOUT_SECONDS = 120.0
# JSON-RPC errors that say the request was refused before the tool ran.
_REFUSED_BEFORE_RUNNING = {-32600, -32601, -32602}


class UpstreamSession:
    """One upstream server, connected once and shared by every call to it."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.session: ClientSession | None = None

    async def connect(self, stack: AsyncExitStack) -> None:
        upstream = self.upstream
        if upstream.command:
            params = StdioServerParameters(
                command=upstream.command[0],
                args=list(upstream.command[1:]),
                env={**get_default_environment(), **_passed_environment(), **upstream.env},
                cwd=upstream.cwd or None,
            )
            read, write = await stack.enter_async_context(stdio_client(params))
        else:
            streams = await stack.enter_async_context(streamable_http_client(upstream.url))
            read, write = streams[0], streams[1]
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        self.session = session

    async def list_tools(self) -> list[types.Tool]:
        assert self.session is not None
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self.session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call(
        self, name: str, arguments: dict[str, Any], idempotency_key: str = ""
    ) -> types.CallToolResult:
        """Call the tool. Raises what the transport raised; ``effect_of`` reads that."""
        assert self.session is not None
        meta: Any = {IDEMPOTENCY_META_KEY: idempotency_key} if idempotency_key else None
        return await self.session.call_tool(
            name, arguments, read_timeout_seconds=CALL_TIMEOUT_SECONDS, meta=meta
        )


def _passed_environment() -> dict[str, str]:
    # The SDK hands a stdio server only a few variables (PATH, HOME, ...); the Python path
    # also reaches it, so that a server run with this interpreter finds its packages.
    return {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "VIRTUAL_ENV")}


def result_digest(result: types.CallToolResult) -> str:
    """The receipt of an upstream's answer: SHA-256 of its RFC 8785 form."""
    body = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return hashlib.sha256(rfc8785.dumps(body)).hexdigest()


@dataclass(frozen=True)
class Effect:
    """What the outside world did, as the console records it."""

    outcome: str  # a ReportedOutcome
    receipt: str = ""
    detail: str = ""
    result: types.CallToolResult | None = None


def effect_of(result: types.CallToolResult | None, error: BaseException | None) -> Effect:
    """The effect of one upstream call: its answer, or the error the call raised."""
    if result is not None:
        digest = result_digest(result)
        if result.is_error:
            return Effect(ReportedOutcome.REJECTED, digest, _text(result)[:500], result)
        return Effect(ReportedOutcome.COMMITTED, digest, "", result)
    if isinstance(error, MCPError) and error.error.code in _REFUSED_BEFORE_RUNNING:
        return Effect(ReportedOutcome.REJECTED, "", f"refused by the upstream: {error}")
    # The request may have reached the upstream and run: only an operator can tell.
    return Effect(ReportedOutcome.OUTCOME_UNKNOWN, "", f"{type(error).__name__}: {error}"[:500])


def _text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
