"""An agent process for the SIGKILL tests of ``approval_console.langchain``: LangChain's
``create_agent`` with ``ConsoleApprovalMiddleware``, a fake model, and a checkpointer that
writes every checkpoint to a file before going on (so a killed process leaves what a
database-backed one would). Every real call of the tool is appended to a file.

    python -m tests.clients.langchain_agent_process URL KEY DIR STEP [KILL]

STEP: ``start`` (prints the occurrence ids the agent pauses on), ``resume`` (resumes as a
HumanInTheLoopMiddleware program does) or ``restart`` (``invoke(None)`` after a crash;
prints the tool message). KILL: ``before_claim`` (SIGKILL after the token's pickup, before
the claim is sent) or ``after_claim`` (after the claim, before the tool runs).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import threading
from pathlib import Path
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

THREAD: RunnableConfig = {"configurable": {"thread_id": "lc-killed-1"}}
CASE = {"case_id": "case_77"}


class FileSaver(InMemorySaver):
    """InMemorySaver whose every write is on disk (atomically) before it returns. The
    graph writes from several threads at once: one at a time."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.lock = threading.Lock()
        if path.exists():
            storage, writes, blobs = pickle.loads(path.read_bytes())
            for thread, namespaces in storage.items():
                self.storage[thread].update(namespaces)
            self.writes.update(writes)
            self.blobs.update(blobs)

    def _save(self) -> None:
        storage = {thread: dict(namespaces) for thread, namespaces in self.storage.items()}
        data = pickle.dumps((storage, dict(self.writes), dict(self.blobs)))
        temporary = self.path.with_suffix(".tmp")
        temporary.write_bytes(data)
        os.replace(temporary, self.path)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            saved = super().put(*args, **kwargs)
            self._save()
        return saved

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        with self.lock:
            super().put_writes(*args, **kwargs)
            self._save()


class FakeModel(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


class Killed(ApprovalConsole):
    """Dies by SIGKILL at ``kill``: no cleanup, no exception handler runs."""

    kill = ""

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        if self.kill == "before_claim":
            os.kill(os.getpid(), signal.SIGKILL)
        claimed = super().claim(*args, **kwargs)
        if self.kill == "after_claim":
            os.kill(os.getpid(), signal.SIGKILL)
        return claimed


def main(url: str, key: str, directory: str, step: str, kill: str = "") -> None:
    folder = Path(directory)
    effects = folder / "effects.jsonl"

    @tool
    def close_case(case_id: str) -> str:
        """Close a support case."""
        with effects.open("a") as out:
            out.write(json.dumps({"case_id": case_id, "key": idempotency_key()}) + "\n")
        return f"{case_id} closed"

    replies = [AIMessage("", tool_calls=[{"name": "close_case", "args": CASE, "id": "call_0"}])]
    if step != "start":
        replies = [AIMessage("Done.")]
    console = Killed(url, key)
    console.kill = kill
    try:
        agent = create_agent(
            FakeModel(messages=iter(replies)),
            tools=[close_case],
            middleware=[
                ConsoleApprovalMiddleware(
                    console, interrupt_on={"close_case": True}, effect_timeout=1
                )
            ],
            checkpointer=FileSaver(folder / "checkpoints.pickle"),
        )
        if step == "start":
            result = agent.invoke({"messages": [HumanMessage("Close case 77.")]}, THREAD)
            (pause,) = result["__interrupt__"]
            calls = pause.value["approval_console"]["calls"]
            print(json.dumps([c["occurrence_id"] for c in calls]))
            return
        resume: Command[Any] | None = (
            Command(resume={"decisions": [{"type": "approve"}]}) if step == "resume" else None
        )
        result = agent.invoke(resume, THREAD)
        (answer,) = [m for m in result["messages"] if isinstance(m, ToolMessage)]
        print(json.dumps({"status": answer.status, "text": answer.text}))
    finally:
        console.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
