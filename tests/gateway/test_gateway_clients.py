"""Issue 27 §3: the gateway used by other MCP clients, as real processes: an OpenAI Agents
SDK agent (its scripted model, no network) with the gateway as its MCP server over
streamable HTTP, and a client that starts the gateway itself over stdio. Each client runs
with ``asyncio.run`` in a thread of its own; the tests are sync functions."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.items import ToolCallOutputItem
from agents.mcp import MCPServerStreamableHttp
from agents.testing import ScriptedModel, assistant_message, function_call
from mcp import ClientSession, StdioServerParameters, stdio_client

from approvals.models import Command, Occurrence
from tests.conftest import approve
from tests.demo.sandbox_fixture import ROOT
from tests.gateway.clients import text_of
from tests.gateway.conftest import Setup, in_thread, pending_occurrence

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REFUND = {"order_id": "ord_9", "amount_minor": 1200, "currency": "EUR"}


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # the SDK would otherwise export traces over the network
    yield


async def agent_run(url: str) -> tuple[str, list[str]]:
    """The agent asks for a refund through the gateway, then says what the tool said."""
    model = ScriptedModel(
        [
            [function_call("shop__issue_refund", REFUND, call_id="call_0")],
            [assistant_message("Done.")],
        ]
    )
    async with MCPServerStreamableHttp(
        {"url": url, "timeout": 30, "sse_read_timeout": 300},
        name="approval-gateway",
        client_session_timeout_seconds=300,
    ) as server:
        agent = Agent(name="support", instructions="Help.", model=model, mcp_servers=[server])
        result = await Runner.run(agent, "Refund 12 EUR on order ord_9.")
    outputs = [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    return str(result.final_output), outputs


def test_an_openai_agents_sdk_agent_uses_the_gateway_as_its_mcp_server(
    gateway_setup: Setup,
) -> None:
    gateway_setup.gateway.start()
    run = in_thread(agent_run(gateway_setup.gateway.url))
    occurrence = pending_occurrence("shop__issue_refund")
    assert occurrence.status == Occurrence.Status.PENDING_REVIEW
    assert not gateway_setup.ledger.calls()
    approve(str(occurrence.pk), gateway_setup.reviewer)

    final, outputs = run.result()

    assert final == "Done."
    (output,) = outputs
    assert "re_0" in output and "ord_9" in output
    (sent,) = gateway_setup.ledger.calls("issue_refund")
    command = Command.objects.get(occurrence=occurrence)
    assert sent["idempotency_key"] == command.idempotency_key
    assert command.state == Command.State.COMMITTED


async def stdio_call(env: dict[str, str], config: str) -> tuple[list[str], Any]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "mcp_gateway", "--config", config, "--stdio"],
        env=env,
        cwd=str(ROOT),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = [t.name for t in (await session.list_tools()).tools]
        result = await session.call_tool("shop__lookup_order", {"order_id": "o7"})
        return tools, result


def test_a_local_client_starts_the_gateway_over_stdio(gateway_setup: Setup) -> None:
    tools, result = in_thread(
        stdio_call(gateway_setup.gateway.env, str(gateway_setup.gateway.config))
    ).result()

    assert "shop__issue_refund" in tools
    assert not result.is_error and "o7" in text_of(result)
    (occurrence,) = Occurrence.objects.filter(tool__name="shop__lookup_order")
    assert occurrence.status == Occurrence.Status.AUTO_ADMITTED
    # A stdio connection has no MCP session id: the gateway process's own is the run id.
    assert occurrence.run_id.startswith("stdio-")
    assert len(gateway_setup.ledger.calls("lookup_order")) == 1
