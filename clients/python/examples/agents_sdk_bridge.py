"""OpenAI Agents SDK: an agent whose close_case calls are decided in the console. The run
stops for approval, its state is saved as JSON, and a later run (in any process) applies
the console's decisions and goes on; the tool runs once with what the reviewer approved.

    pip install './clients/python[openai-agents]'
    export APPROVAL_CONSOLE_URL=http://127.0.0.1:8000 APPROVAL_CONSOLE_KEY=rk_...
    python clients/python/examples/agents_sdk_bridge.py

and approve (or reject) the "close_case" request in the console's inbox. The run id names
the conversation: run it again with another APPROVAL_CONSOLE_RUN_ID for a new request.
"""

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from agents import Agent, Runner, RunState, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from approval_console import AsyncApprovalConsole
from approval_console.openai_agents import ConsoleBridge

URL = os.environ.get("APPROVAL_CONSOLE_URL", "http://127.0.0.1:8000")
KEY = os.environ["APPROVAL_CONSOLE_KEY"]  # a runtime key, rk_...
RUN_ID = os.environ.get("APPROVAL_CONSOLE_RUN_ID", "conversation-7")

# A scripted model, so that the example runs without an API key: it asks for close_case,
# then answers. Your model goes here instead: model="gpt-4.1" (with OPENAI_API_KEY set),
# and leave tracing on.
model = ScriptedModel(
    [
        [function_call("close_case", {"case_id": "case_77"}, call_id="call_0")],
        [assistant_message("Case 77 is closed.")],
    ]
)
set_tracing_disabled(True)  # no traces exported without an OpenAI key


async def close_in_crm(arguments: Mapping[str, Any], idempotency_key: str) -> str:
    """The real effect. Your CRM's call goes here, sent with the idempotency key; what it
    returns is the effect's receipt, which the model reads."""
    print(f"CRM: closing {arguments['case_id']} with idempotency key {idempotency_key}")
    return f"{arguments['case_id']} closed"


async def main() -> None:
    bridge = ConsoleBridge(AsyncApprovalConsole(URL, KEY, long_poll=True), run_id=RUN_ID)
    close_case = await bridge.tool_from_contract("close_case", close_in_crm)
    agent = Agent(name="support", instructions="Help.", model=model, tools=[close_case])

    result = await Runner.run(agent, "Close case 77")
    proposed = await bridge.submit(result.interruptions)  # one per approval request
    print("waiting for a decision on", [p.occurrence_id for p in proposed])
    saved = result.to_state().to_json()  # keep it; the process may end here

    state = await RunState.from_json(agent, saved)  # later, in any process
    # bridge.resolve(state) applies the decisions taken so far; wait waits for the rest.
    resolution = await bridge.wait(state, timeout=3600)  # applies approve / reject
    for call_id, reason in resolution.rejected.items():
        print(f"rejected {call_id}:", reason)
    if resolution.ready:
        result = await Runner.run(agent, state)
    for outcome in bridge.outcomes:  # what the tool did, as the model was told
        print(f"tool ({outcome.status}):", outcome.message)
    print("model:", result.final_output)
    await bridge.client.aclose()


asyncio.run(main())
