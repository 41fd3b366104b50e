"""The gateway's MCP server: the upstreams' tools under prefixed names, and a ``tools/call``
that passes read-only tools by policy and puts every other call before a reviewer.

A gated call is proposed (run id = the MCP session, client ref = the request id) and
followed to its end by ``gateway.calls``; the request waits for it. Meanwhile a client that
declared URL-mode elicitation (MCP 2025-11-25) is sent one pointing at the review page, and
every client that asked for progress gets a note every few seconds, which also keeps the
request open while nobody has decided yet.
"""

from __future__ import annotations

import logging
import sys
import uuid
from contextlib import AsyncExitStack
from typing import Any

import anyio
from django.urls import reverse
from mcp import MCPError, types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import INVALID_PARAMS

from approvals.errors import InputError, ServiceError
from gateway import console
from gateway.calls import Calls, Follower, in_thread, text_result
from gateway.config import GatewayConfig
from gateway.contracts import GatewayTool, gateway_tool
from gateway.upstreams import UpstreamSession

logger = logging.getLogger(__name__)

REASON = "Called through the MCP gateway {gateway} (upstream {upstream}, tool {tool})."


class Gateway:
    """The upstream connections, the tools and contracts, and the calls being followed."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.sessions = {u.name: UpstreamSession(u) for u in config.upstreams}
        self.tools: dict[str, GatewayTool] = {}
        self.links: dict[str, console.Link] = {}
        # A stdio connection has no MCP session id: the process's own stands in for it.
        self.stdio_session = f"stdio-{uuid.uuid4()}"
        self.calls = Calls(
            gateway=config.name,
            tools=self.tools,
            links=self.links,
            sessions=self.sessions,
            poll_seconds=config.poll_seconds,
        )

    async def start(self, stack: AsyncExitStack) -> None:
        """Check the runtime keys, connect the upstreams, register the contracts."""
        for upstream in self.config.upstreams:
            self.links[upstream.name] = await in_thread(console.link_for, upstream)
        for name, session in self.sessions.items():
            await session.connect(stack)
            for tool in await session.list_tools():
                offered = gateway_tool(session.upstream, tool)
                self.tools[offered.name] = offered
            logger.info("upstream %s connected", name)
        changed, refused = await in_thread(
            console.contracts_register, self.config, list(self.tools.values()), self.links
        )
        for name, why in refused.items():
            # Not offered: a call could never be proposed under a contract that is not there.
            logger.warning(
                "tool %s is not offered: the console refused its contract: %s", name, why
            )
            self.tools.pop(name)
        logger.info(
            "%d tools offered, %d contracts registered or changed", len(self.tools), changed
        )

    def server(self) -> Server[Any]:
        return Server(
            "approval-console-gateway",
            version="1",
            instructions="Tools of other MCP servers. Calls that change something wait for "
            "a person to approve them in the approval console; the answer says what happened.",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.tool for t in self.tools.values()])

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = self.tools.get(params.name)
        if tool is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")
        arguments = dict(params.arguments or {})
        try:
            opened = await in_thread(
                console.call_open,
                gateway=self.config.name,
                link=self.links[tool.upstream.name],
                tool=tool,
                arguments=arguments,
                session_id=self._session_id(ctx),
                request_id=str(ctx.request_id),
                reason=REASON.format(
                    gateway=self.config.name, upstream=tool.upstream.name, tool=tool.upstream_name
                ),
            )
        except (InputError, ServiceError) as exc:
            return text_result(
                f"The approval console refused this call: {console.refusal_text(exc)}", error=True
            )
        if opened.call_id is None:
            return await self._pass_through(tool, arguments)
        follower = self.calls.follow(opened.call_id, opened.occurrence_id, tool)
        follower.asked = arguments
        await self._wait_with_client(ctx, follower, tool)
        assert follower.result is not None
        return follower.result

    def _session_id(self, ctx: ServerRequestContext[Any]) -> str:
        request = ctx.request
        headers = getattr(request, "headers", None)
        session = headers.get("mcp-session-id") if headers is not None else None
        return str(session) if session else self.stdio_session

    async def _pass_through(
        self, tool: GatewayTool, arguments: dict[str, Any]
    ) -> types.CallToolResult:
        """A read-only tool, admitted by policy (recorded as such by the console)."""
        try:
            return await self.sessions[tool.upstream.name].call(tool.upstream_name, arguments)
        except Exception as exc:
            return text_result(f"The upstream server failed: {type(exc).__name__}", error=True)

    def review_url(self, occurrence_id: uuid.UUID) -> str:
        path = reverse("approvals:review", args=[occurrence_id])
        return f"{self.config.console_url.rstrip('/')}{path}"

    async def _wait_with_client(
        self, ctx: ServerRequestContext[Any], follower: Follower, tool: GatewayTool
    ) -> None:
        url = self.review_url(follower.occurrence_id)
        elicitation_id = str(follower.occurrence_id)
        elicit = _declared_url_elicitation(ctx)
        async with anyio.create_task_group() as group:
            if elicit:
                group.start_soon(self._elicit, ctx, url, elicitation_id, tool)
            group.start_soon(self._progress, ctx, url)
            await follower.done.wait()
            group.cancel_scope.cancel()
        if elicit:
            try:
                await ctx.session.send_elicit_complete(elicitation_id, ctx.request_id)
            except Exception as exc:  # the client may be gone; the call's end is recorded
                logger.info("elicitation complete not sent: %r", exc)

    async def _elicit(
        self, ctx: ServerRequestContext[Any], url: str, elicitation_id: str, tool: GatewayTool
    ) -> None:
        message = (
            f"{tool.name} needs a person's approval in the approval console. Open the "
            "review page to see exactly what will run, and approve or reject it there."
        )
        try:
            answer = await ctx.session.elicit_url(message, url, elicitation_id, ctx.request_id)
            logger.info("elicitation %s: %s", elicitation_id, answer.action)
        except Exception as exc:
            logger.info("elicitation %s not answered: %r", elicitation_id, exc)

    async def _progress(self, ctx: ServerRequestContext[Any], url: str) -> None:
        waited = 0
        while True:
            try:
                await ctx.session.report_progress(
                    waited, None, f"Waiting for a reviewer's decision: {url}"
                )
            except Exception as exc:
                logger.info("progress not sent: %r", exc)
                return
            await anyio.sleep(self.config.progress_seconds)
            waited += 1


def _declared_url_elicitation(ctx: ServerRequestContext[Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and elicitation.url is not None


async def serve(config: GatewayConfig, *, stdio: bool) -> None:
    """Run the gateway until its transport ends (stdio) or it is stopped (HTTP)."""
    import uvicorn

    async with AsyncExitStack() as stack:
        gateway = Gateway(config)
        await gateway.start(stack)
        server = gateway.server()
        async with anyio.create_task_group() as group:
            gateway.calls.attach(group)
            resumed = await gateway.calls.resume()
            if resumed:
                logger.warning("resumed %d unfinished calls from the journal", resumed)
            if stdio:
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())
            else:
                app = server.streamable_http_app(host=config.host)
                http = uvicorn.Server(
                    uvicorn.Config(
                        app,
                        host=config.host,
                        port=config.port,
                        log_level="warning",
                        # Requests still waiting for a decision do not hold a stop up: their
                        # calls are in the journal, and the next start follows them.
                        timeout_graceful_shutdown=5,
                    )
                )
                print(
                    f"MCP gateway {config.name}: {len(gateway.tools)} tools at "
                    f"http://{config.host}:{config.port}/mcp",
                    file=sys.stderr,
                    flush=True,
                )
                await http.serve()
            group.cancel_scope.cancel()
