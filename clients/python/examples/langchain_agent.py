"""LangChain: a create_agent program whose human-in-the-loop middleware is the console's.
The one line that changes from LangChain's own HumanInTheLoopMiddleware is marked.

    pip install './clients/python[langchain]'
    export APPROVAL_CONSOLE_URL=http://127.0.0.1:8000 APPROVAL_CONSOLE_KEY=rk_...
    python clients/python/examples/langchain_agent.py

and approve, edit or reject the "close_case" request in the console's inbox. The thread id
is the run id: run it again with another APPROVAL_CONSOLE_RUN_ID for a new request.
"""

import os
from typing import Any

from approval_console import ApprovalConsole
from approval_console.langchain import ConsoleApprovalMiddleware, idempotency_key
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

URL = os.environ.get("APPROVAL_CONSOLE_URL", "http://127.0.0.1:8000")
KEY = os.environ["APPROVAL_CONSOLE_KEY"]  # a runtime key, rk_...
THREAD_ID = os.environ.get("APPROVAL_CONSOLE_RUN_ID", "lc-thread-1")


class ScriptedModel(GenericFakeChatModel):
    """A scripted model, so that the example runs without an API key: it asks for
    close_case, then answers. Your chat model goes here instead (ChatOpenAI(...), ...)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


model = ScriptedModel(
    messages=iter(
        [
            AIMessage(
                "",
                tool_calls=[{"name": "close_case", "args": {"case_id": "case_77"}, "id": "call_0"}],
            ),
            AIMessage("Case 77 is closed."),
        ]
    )
)


@tool
def close_case(case_id: str) -> str:
    """Close a support case. The real effect: your CRM's call goes here, sent with the
    idempotency key of the approved command; what it returns is the effect's receipt."""
    print(f"CRM: closing {case_id} with idempotency key {idempotency_key()}")
    return f"{case_id} closed"


console = ApprovalConsole(URL, KEY, long_poll=True)
agent = create_agent(
    model,
    tools=[close_case],
    # was: middleware=[HumanInTheLoopMiddleware(interrupt_on={"close_case": True})],
    middleware=[ConsoleApprovalMiddleware(console, interrupt_on={"close_case": True})],
    checkpointer=InMemorySaver(),  # a durable one to resume elsewhere
)

config: RunnableConfig = {"configurable": {"thread_id": THREAD_ID}}
result = agent.invoke({"messages": [HumanMessage("Close case 77")]}, config)
while "__interrupt__" in result:  # paused: a person reviews the calls in the console
    calls = result["__interrupt__"][0].value["approval_console"]["calls"]
    for call in calls:
        print("waiting for a decision on", call["occurrence_id"])
        console.wait(call["occurrence_id"], timeout=3600)  # or come back later
    # What a HumanInTheLoopMiddleware program sends; the console's decisions are what count.
    result = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
for message in result["messages"]:
    if isinstance(message, ToolMessage):  # what the model was told
        print(f"tool ({message.status}):", message.text)
print("model:", result["messages"][-1].text)
console.close()
