"""The client's examples (clients/python/examples/) run as written: each file in a Python
process of its own, as a newcomer runs it, against a live console, while a reviewer decides
in the console. The README's code blocks are excerpts of these files, checked here too, so
that the two cannot drift apart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from approvals.models import Command, Occurrence
from reconciliation.dispatch import command_dispatch
from tests.clients.conftest import approve, reject
from tests.demo.sandbox_fixture import SandboxProcess

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
EXAMPLES = CLIENT / "examples"
README = CLIENT / "README.md"

# A README code block that shows an example names its file on the line before it.
EXCERPT = re.compile(r"<!-- example: (?P<path>\S+) -->\n```python\n(?P<code>.*?)```\n", re.S)

# How long an example may take to propose, and then to finish once decided: generous, as
# importing LangGraph or the Agents SDK takes seconds on a loaded machine.
STARTUP_SECONDS = 60.0
FINISH_SECONDS = 60.0


def example_files() -> list[str]:
    return sorted(path.name for path in EXAMPLES.glob("*.py"))


def test_every_python_block_of_the_readme_is_an_excerpt_of_an_example():
    readme = README.read_text()
    excerpts = list(EXCERPT.finditer(readme))
    assert readme.count("```python") == len(excerpts), (
        "each ```python block of clients/python/README.md needs a runnable file in "
        "clients/python/examples/, named in an <!-- example: examples/NAME.py --> line above it"
    )
    for excerpt in excerpts:
        source = (CLIENT / excerpt["path"]).read_text()
        code = excerpt["code"]
        # The excerpt may come from inside a function: the file holds it indented.
        assert any(textwrap.indent(code, " " * n) in source for n in (0, 4, 8)), (
            f"the README's block for {excerpt['path']} is not the file's text:\n{code}"
        )
    shown = {Path(excerpt["path"]).name for excerpt in excerpts}
    assert shown == set(example_files())
    for name in example_files():
        assert f"](examples/{name})" in readme, f"the README does not link examples/{name}"


@dataclass
class Finished:
    stdout: str
    stderr: str
    occurrence_id: str

    def explain(self) -> str:
        return f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def run_example(
    name: str,
    live_server: Any,
    runtime: Any,
    tmp_path: Path,
    decide: Callable[[str], object],
    then: Callable[[str], object] | None = None,
) -> Finished:
    """Start ``examples/<name>`` in a process of its own, pointed at the live console; once
    it has proposed, check that nothing ran yet, ``decide`` the occurrence as a reviewer,
    run ``then`` (the console's worker), and wait for the process to finish (exit 0)."""
    env = {
        **os.environ,
        "APPROVAL_CONSOLE_URL": live_server.url,
        "APPROVAL_CONSOLE_KEY": runtime.raw_key,
        # The client as the README's pip install would provide it.
        "PYTHONPATH": str(CLIENT / "src"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("OPENAI_API_KEY", None)  # the examples' scripted models need no network
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLES / name)], env=env, stdout=stdout, stderr=stderr
        )
        try:
            occurrence_id = _proposed(process, out, err)
            assert "CRM:" not in out.read_text()  # nothing runs before a decision
            assert not Command.objects.filter(occurrence_id=occurrence_id).exists()
            decide(occurrence_id)
            if then is not None:
                then(occurrence_id)
            returncode = process.wait(timeout=FINISH_SECONDS)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    finished = Finished(out.read_text(), err.read_text(), occurrence_id)
    assert returncode == 0, finished.explain()
    return finished


def _proposed(process: subprocess.Popen[bytes], out: Path, err: Path) -> str:
    """The occurrence the example proposed, once it waits for a reviewer."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        pending = list(
            Occurrence.objects.filter(status=Occurrence.Status.PENDING_REVIEW).values_list(
                "pk", flat=True
            )
        )
        if pending:
            (occurrence_id,) = pending
            return str(occurrence_id)
        if process.poll() is not None:
            pytest.fail(
                f"the example exited ({process.returncode}) without proposing:\n"
                f"stdout:\n{out.read_text()}\nstderr:\n{err.read_text()}"
            )
        time.sleep(0.1)
    pytest.fail(f"the example proposed nothing in {STARTUP_SECONDS} s:\n{err.read_text()}")


def the_case_was_closed_once(finished: Finished, run_id: str) -> Command:
    """One command, committed, whose idempotency key the example's CRM call was sent with."""
    (command,) = Command.objects.filter(occurrence_id=finished.occurrence_id)
    assert command.state == Command.State.COMMITTED, finished.explain()
    crm_calls = [line for line in finished.stdout.splitlines() if line.startswith("CRM:")]
    assert crm_calls == [f"CRM: closing case_77 with idempotency key {command.idempotency_key}"]
    occurrence = Occurrence.objects.get(pk=finished.occurrence_id)
    assert occurrence.tool.name == "close_case" and occurrence.run_id == run_id
    return command


def nothing_ran(finished: Finished) -> None:
    assert "CRM:" not in finished.stdout, finished.explain()
    assert not Command.objects.filter(occurrence_id=finished.occurrence_id).exists()
    assert Occurrence.objects.count() == 1  # nothing was proposed again


REASON = "The customer called back: the case is still open."

examples = pytest.mark.django_db(transaction=True)  # the live server sees the test's data


@pytest.mark.slow
@examples
def test_plain_use_runs_what_the_reviewer_approved(
    live_server: Any, runtime: Any, reviewer: Any, tmp_path: Path
):
    finished = run_example(
        "plain.py", live_server, runtime, tmp_path, lambda pk: approve(pk, reviewer)
    )
    the_case_was_closed_once(finished, "run-42")
    assert finished.stdout.splitlines()[-1] == "committed: case_77 closed"


@pytest.mark.slow
@examples
def test_plain_use_prints_the_rejection(
    live_server: Any, runtime: Any, reviewer: Any, tmp_path: Path
):
    finished = run_example(
        "plain.py", live_server, runtime, tmp_path, lambda pk: reject(pk, reviewer, REASON)
    )
    nothing_ran(finished)
    assert finished.stdout.splitlines()[-1] == f"rejected: {REASON}"


@pytest.mark.slow
@examples
def test_langgraph_example_resumes_and_runs_the_approved_call(
    live_server: Any, runtime: Any, reviewer: Any, tmp_path: Path
):
    finished = run_example(
        "langgraph_tool_node.py", live_server, runtime, tmp_path, lambda pk: approve(pk, reviewer)
    )
    the_case_was_closed_once(finished, "thread-1")
    lines = finished.stdout.splitlines()
    assert lines[-2].startswith("tool (success):") and "case_77 closed" in lines[-2]
    assert lines[-1] == "model: Case 77 is closed."


@pytest.mark.slow
@examples
@pytest.mark.parametrize("example", ["langgraph_tool_node.py", "langchain_agent.py"])
def test_the_langgraph_and_langchain_examples_tell_the_model_the_rejection(
    live_server: Any, runtime: Any, reviewer: Any, tmp_path: Path, example: str
):
    finished = run_example(
        example, live_server, runtime, tmp_path, lambda pk: reject(pk, reviewer, REASON)
    )
    nothing_ran(finished)
    assert any(
        line.startswith("tool (error):") and REASON in line for line in finished.stdout.splitlines()
    ), finished.explain()


@pytest.mark.slow
@examples
def test_langchain_example_runs_the_approved_call_once(
    live_server: Any, runtime: Any, reviewer: Any, tmp_path: Path
):
    finished = run_example(
        "langchain_agent.py", live_server, runtime, tmp_path, lambda pk: approve(pk, reviewer)
    )
    the_case_was_closed_once(finished, "lc-thread-1")
    lines = finished.stdout.splitlines()
    assert lines[-2] == "tool (success): case_77 closed", finished.explain()
    assert lines[-1] == "model: Case 77 is closed."


@pytest.mark.slow
@examples
def test_agents_sdk_example_resumes_the_saved_state_and_runs_the_approved_call(
    live_server: Any, runtime: Any, reviewer: Any, tmp_path: Path
):
    finished = run_example(
        "agents_sdk_bridge.py", live_server, runtime, tmp_path, lambda pk: approve(pk, reviewer)
    )
    the_case_was_closed_once(finished, "conversation-7")
    lines = finished.stdout.splitlines()
    assert lines[-2].startswith("tool (executed):") and "case_77 closed" in lines[-2]
    assert lines[-1] == "model: Case 77 is closed."


@pytest.mark.slow
@examples
def test_agents_sdk_example_applies_the_rejection(
    live_server: Any, runtime: Any, reviewer: Any, tmp_path: Path
):
    finished = run_example(
        "agents_sdk_bridge.py",
        live_server,
        runtime,
        tmp_path,
        lambda pk: reject(pk, reviewer, REASON),
    )
    nothing_ran(finished)
    assert f"rejected call_0: {REASON}" in finished.stdout.splitlines(), finished.explain()


def console_worker(occurrence_id: str) -> None:
    """The console's worker: once the example claimed, deliver its command (the Celery
    task calls the same service) to the sandbox payments service."""
    deadline = time.monotonic() + FINISH_SECONDS
    while not (command := Command.objects.filter(occurrence_id=occurrence_id).first()):
        assert time.monotonic() < deadline, "the example did not claim"
        time.sleep(0.1)
    command_dispatch(command_id=str(command.pk))


@pytest.mark.slow
@examples
def test_console_executed_example_waits_for_the_refund_the_console_sent(
    live_server: Any, runtime: Any, reviewer: Any, payments: SandboxProcess, tmp_path: Path
):
    finished = run_example(
        "console_executed.py",
        live_server,
        runtime,
        tmp_path,
        lambda pk: approve(pk, reviewer),
        then=console_worker,
    )
    (refund,) = payments.refunds()  # one effect, sent by the console, not by the example
    (command,) = Command.objects.filter(occurrence_id=finished.occurrence_id)
    assert command.executed_by == "console" and command.state == Command.State.COMMITTED
    assert refund["idempotency_key"] == command.idempotency_key
    lines = finished.stdout.splitlines()
    assert "claimed; executed by console" in lines
    assert lines[-1].startswith("effect: committed, receipt re_"), finished.explain()
