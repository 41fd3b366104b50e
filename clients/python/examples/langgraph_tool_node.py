"""LangGraph: a graph whose close_case calls wait for a person's approval in the console,
then run once with what the reviewer approved.

    pip install './clients/python[langgraph]'
    export APPROVAL_CONSOLE_URL=http://127.0.0.1:8000 APPROVAL_CONSOLE_KEY=rk_...
    python clients/python/examples/langgraph_tool_node.py

and approve (or reject) the "close_case" request in the console's inbox. The thread id is
the run id: run it again with another APPROVAL_CONSOLE_RUN_ID for a new request.
"""

import os
from collections.abc import Mapping
from typing import Any

from approval_console import ApprovalConsole
from approval_console.langgraph import gated_tool, tool_node
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command

URL = os.environ.get("APPROVAL_CONSOLE_URL", "http://127.0.0.1:8000")
KEY = os.environ["APPROVAL_CONSOLE_KEY"]  # a runtime key, rk_...
THREAD_ID = os.environ.get("APPROVAL_CONSOLE_RUN_ID", "thread-1")

# A scripted model, so that the example runs without an API key: it asks for close_case,
# then answers. Your chat model goes here instead, with the tool bound to it, e.g.
# ChatOpenAI(model="gpt-4.1").bind_tools([close_case_schema]), the schema from
# console.tool("close_case").arguments_schema.
model = GenericFakeChatModel(
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


def close_in_crm(arguments: Mapping[str, Any], idempotency_key: str) -> str:
    """The real effect. Your CRM's call goes here, sent with the idempotency key; what it
    returns is the effect's receipt, which the model reads."""
    print(f"CRM: closing {arguments['case_id']} with idempotency key {idempotency_key}")
    return f"{arguments['case_id']} closed"


def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
    return {"messages": [model.invoke(state["messages"])]}


def route(state: MessagesState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


console = ApprovalConsole(URL, KEY, long_poll=True)
close_case = gated_tool(console, "close_case", close_in_crm)

builder = StateGraph(MessagesState, input_schema=MessagesState)  # types invoke()
builder.add_node("agent", agent)
builder.add_node("tools", tool_node(close_case))  # instead of ToolNode for gated tools
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", route, ["tools", END])
builder.add_edge("tools", "agent")
app = builder.compile(checkpointer=InMemorySaver())  # a durable one to resume elsewhere

config: RunnableConfig = {"configurable": {"thread_id": THREAD_ID}}
result = app.invoke({"messages": [HumanMessage("Close case 77")]}, config)
while "__interrupt__" in result:  # paused: a person reviews the call
    pause = result["__interrupt__"][0].value["approval_console"]  # occurrence_id, arguments
    print("waiting for a decision on", pause["occurrence_id"])
    console.wait(pause["occurrence_id"], timeout=3600)  # or come back later
    result = app.invoke(Command(resume="decided"), config)  # the console's decision counts
for message in result["messages"]:
    if isinstance(message, ToolMessage):  # what the model was told
        print(f"tool ({message.status}):", message.text)
print("model:", result["messages"][-1].text)
console.close()
