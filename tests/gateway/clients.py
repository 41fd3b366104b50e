"""A real MCP client (``mcp.ClientSession`` over streamable HTTP) for the gateway tests, and
what it saw: elicitations, progress notes, the tool's result."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client


@dataclass
class Seen:
    elicitations: list[types.ElicitRequestURLParams] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    progress: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    # Each elicitation's URL, for a reviewer in another thread to open.
    urls: queue.Queue[str] = field(default_factory=queue.Queue)


async def call(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    seen: Seen,
    *,
    elicitation: bool = True,
) -> types.CallToolResult:
    """Connect, list the tools, call ``tool`` and wait for its answer. With
    ``elicitation`` the client declares elicitation (form and URL mode) and accepts each."""

    on_elicit = _accepting(seen)

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ElicitCompleteNotification):
            seen.completed.append(message.params.elicitation_id)

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.progress.append(message or "")

    async with (
        streamable_http_client(url) as streams,
        ClientSession(
            streams[0],
            streams[1],
            elicitation_callback=on_elicit if elicitation else None,
            message_handler=on_message,
        ) as session,
    ):
        await session.initialize()
        seen.tools = [t.name for t in (await session.list_tools()).tools]
        return await session.call_tool(
            tool, arguments, read_timeout_seconds=300, progress_callback=on_progress
        )


def text_of(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def call_and_hang_up(url: str, tool: str, arguments: dict[str, Any], seen: Seen) -> None:
    """Call ``tool``, then disconnect (ending the MCP session) once the elicitation came,
    before anyone decided: a client that went away mid-call."""
    async with (
        streamable_http_client(url) as streams,
        ClientSession(streams[0], streams[1], elicitation_callback=_accepting(seen)) as session,
    ):
        await session.initialize()
        async with anyio.create_task_group() as group:
            group.start_soon(session.call_tool, tool, arguments)
            while not seen.elicitations:
                await anyio.sleep(0.05)
            group.cancel_scope.cancel()


def _accepting(seen: Seen) -> Any:
    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestURLParams), params
        seen.elicitations.append(params)
        seen.urls.put(params.url)
        return types.ElicitResult(action="accept")

    return on_elicit
