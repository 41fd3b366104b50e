"""``manage.py find_approval_replays``: replays found, the look-alikes not, tokens never shown.

Files of both formats the scanner reads: this console's ``/api/v1/audit/events`` lines
(and a real export of a claim flow) and the article's ``{"event": "approval_decision"}``
lines. Exit codes: 0 clean, 1 replay, 2 unreadable, 3 malformed lines and no replay.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from approvals.access import tokens
from approvals.audit import replay_scan
from tests.conftest import Runtime

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "manage.py"

FP_A = "3f2a9c1e0b7d4a55"
FP_B = "77aa01bb02cc03dd"

_ids = itertools.count(1)


def console(
    kind: str = "claim.approved",
    fp: str | None = FP_A,
    execution: str | None = "worker-a",
    event_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An audit line as ``approvals.audit.export.audit_event_line`` writes it."""
    n = next(_ids)
    decision = kind.removeprefix("claim.") if kind.startswith("claim.") else None
    line = {
        "cursor": n,
        "event_id": event_id or f"00000000-0000-4000-8000-{n:012d}",
        "kind": kind,
        "occurrence_id": "5b0c1c1e-0000-4000-8000-000000000001",
        "actor": "runtime",
        "token_fingerprint": fp,
        "decision": decision,
        "reason_code": None,
        "execution_id": execution,
        "message_id": f"msg-{execution}",
        "command_id": None,
        "trace_id": None,
        "source_time": "2026-03-01T10:00:00+00:00",
        "ingested_at": f"2026-03-01T10:00:{n % 60:02d}+00:00",
        "data": {},
    }
    line.update(extra)
    return line


def article(
    decision: str = "approved",
    fp: str = FP_A,
    execution: str = "exec-1",
    event: str = "approval_decision",
    **extra: Any,
) -> dict[str, Any]:
    """A line of the background article's audit format."""
    return {
        "event": event,
        "tenant_id": "shop-a",
        "token_fingerprint": fp,
        "decision": decision,
        "execution_id": execution,
        "message_id": f"msg-{execution}",
        "trace_id": "trace-1",
        **extra,
    }


def ndjson(rows: Iterable[dict[str, Any] | str | bytes]) -> bytes:
    out = []
    for row in rows:
        if isinstance(row, bytes):
            out.append(row)
        elif isinstance(row, str):
            out.append(row.encode())
        else:
            out.append(json.dumps(row).encode())
    return b"\n".join(out) + b"\n"


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def document(self) -> Any:
        return json.loads(self.out)


def run(tmp_path: Path, data: bytes, *args: str) -> Run:
    """The command on a file holding ``data``, in this process."""
    path = tmp_path / "audit.ndjson"
    path.write_bytes(data)
    return run_command(str(path), *args)


def run_command(*args: str, stdin: Any = None) -> Run:
    out, err = io.StringIO(), io.StringIO()
    extra = {} if stdin is None else {"stdin": stdin}
    try:
        call_command("find_approval_replays", *args, stdout=out, stderr=err, **extra)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    except CommandError as error:
        code = error.returncode
        err.write(str(error))
    return Run(code, out.getvalue(), err.getvalue())


# --- console format -----------------------------------------------------------------------


def test_two_approved_executions_of_one_fingerprint_are_a_replay(tmp_path: Path) -> None:
    data = ndjson(
        [
            console("approval.issued", execution=None, decision="issued"),
            console(execution="worker-a"),
            console(fp=FP_B, execution="worker-c"),  # another approval, used once
            console(execution="worker-b"),
        ]
    )

    result = run(tmp_path, data)

    assert result.code == 1, result
    assert result.out.splitlines()[0] == (
        f"replay fingerprint {FP_A}: 2 approved executions: "
        "worker-a (1 decision, first line 2), worker-b (1 decision, first line 4)"
    )
    assert FP_B not in result.out
    assert "REPLAY: 1 fingerprint with more than one approved execution." in result.out
    assert result.err == ""


def test_the_guard_working_is_not_a_replay(tmp_path: Path) -> None:
    # One approved execution, a denied second execution, a redelivery of the first.
    data = ndjson(
        [
            console(execution="worker-a"),
            console("claim.replayed", execution="worker-b", reason_code="consumed_by_other"),
            console("claim.duplicate_delivery", execution="worker-a"),
            console("claim.scope_mismatch", execution="worker-c"),
        ]
    )

    result = run(tmp_path, data)

    assert result.code == 0, result
    assert result.out.strip() == (
        f"Scanned 4 lines ({len(data):,} bytes): 1 approved claim decision under 1 fingerprint; "
        "0 duplicated audit deliveries not counted; 0 malformed lines skipped. "
        "No fingerprint has more than one approved execution."
    )


def test_a_healthy_redelivery_is_not_a_replay(tmp_path: Path) -> None:
    # The queue delivered worker-a's message four times: one approved, three duplicates.
    data = ndjson(
        [console(execution="worker-a")]
        + [console("claim.duplicate_delivery", execution="worker-a") for _ in range(3)]
    )

    result = run(tmp_path, data, "--json")

    assert result.code == 0, result
    assert result.document["replays"] == []
    assert result.document["summary"]["approved_decisions"] == 1


def test_a_duplicated_audit_delivery_is_not_a_replay(tmp_path: Path) -> None:
    # The sink ingested the producer's one claim event twice: two cursors, one event id.
    claim = console(execution="worker-a")
    again = {**claim, "cursor": claim["cursor"] + 1000, "ingested_at": "2026-03-01T11:00:00+00:00"}
    data = ndjson([claim, console("claim.replayed", execution="worker-b"), again])

    result = run(tmp_path, data)

    assert result.code == 0, result
    assert "1 approved claim decision under 1 fingerprint" in result.out
    assert "1 duplicated audit delivery not counted" in result.out


def test_a_duplicated_delivery_next_to_a_real_replay_is_counted_as_rows(tmp_path: Path) -> None:
    claim = console(execution="worker-a")
    data = ndjson([claim, {**claim, "cursor": 999}, console(execution="worker-b")])

    result = run(tmp_path, data, "--json")

    assert result.code == 1
    assert result.document["replays"] == [
        {
            "fingerprint": FP_A,
            "executions": [
                {"execution_id": "worker-a", "decisions": 1, "deliveries": 2, "first_line": 1},
                {"execution_id": "worker-b", "decisions": 1, "deliveries": 1, "first_line": 3},
            ],
        }
    ]
    text = run(tmp_path, data)
    assert "worker-a (1 decision in 2 audit rows, first line 1)" in text.out


def test_one_execution_approved_by_two_producer_decisions_is_noted_not_a_replay(
    tmp_path: Path,
) -> None:
    data = ndjson([console(execution="worker-a"), console(execution="worker-a")])

    result = run(tmp_path, data)

    assert result.code == 0
    assert result.out.startswith(
        f"reapproved fingerprint {FP_A}: one execution approved by several distinct "
        "decisions: worker-a (2 decisions, first line 1)"
    )
    assert "the guard should have said duplicate_delivery" in result.out


def test_a_real_export_of_the_console_reads_as_the_control_working(
    tmp_path: Path, runtime: Runtime, token: str
) -> None:
    assert runtime.claim(token, "worker-a").json()["decision"] == "approved"
    assert runtime.claim(token, "worker-a").json()["decision"] == "duplicate_delivery"
    assert runtime.claim(token, "worker-b").status_code == 403
    response = runtime.get("/api/v1/audit/events")
    export = b"".join(response.streaming_content)
    claimed = next(json.loads(line) for line in export.splitlines() if b'"claim.approved"' in line)

    clean = run(tmp_path, export)
    # The sink delivers the claim event once more: still one decision.
    redelivered = run(tmp_path, export + ndjson([{**claimed, "cursor": 10**6}]))
    # A second approved execution under the same fingerprint: the control failed.
    forged = {**claimed, "event_id": "forged", "execution_id": "worker-b"}
    failed = run(tmp_path, export + ndjson([forged]))

    assert clean.code == 0, clean
    assert "1 approved claim decision under 1 fingerprint" in clean.out
    assert redelivered.code == 0, redelivered
    assert "1 duplicated audit delivery not counted" in redelivered.out
    assert failed.code == 1, failed
    assert f"replay fingerprint {claimed['token_fingerprint']}: 2 approved" in failed.out
    for result in (clean, redelivered, failed):
        assert token not in result.out + result.err


# --- the article's format -----------------------------------------------------------------


def test_article_format_replay_and_clean(tmp_path: Path) -> None:
    replay = ndjson(
        [
            article("issued", event="approval_issued", execution="-"),
            article(execution="exec-1"),
            article("replayed", execution="exec-2"),
            article(execution="exec-3"),
        ]
    )
    clean = ndjson(
        [
            article(execution="exec-1"),
            article("replayed", execution="exec-2"),
            # Approved, but not a claim decision: the article's other events do not count.
            article(event="approval_recorded", execution="exec-9"),
        ]
    )

    found = run(tmp_path, replay, "--json")
    none = run(tmp_path, clean)

    assert found.code == 1
    assert [r["fingerprint"] for r in found.document["replays"]] == [FP_A]
    assert [e["execution_id"] for e in found.document["replays"][0]["executions"]] == [
        "exec-1",
        "exec-3",
    ]
    assert none.code == 0, none


def test_article_producer_ids_dedupe_a_duplicated_delivery(tmp_path: Path) -> None:
    data = ndjson(
        [
            article(execution="exec-1", decision_id="d-1"),
            article(execution="exec-1", decision_id="d-1"),
        ]
    )

    result = run(tmp_path, data, "--json")

    assert result.code == 0
    assert result.document["summary"]["duplicate_deliveries"] == 1
    assert result.document["reapproved"] == []


def test_a_replay_across_the_two_formats(tmp_path: Path) -> None:
    data = ndjson([console(execution="worker-a"), article(execution="worker-z", fp=FP_A)])

    result = run(tmp_path, data)

    assert result.code == 1
    assert "worker-a (1 decision, first line 1), worker-z (1 decision, first line 2)" in result.out


# --- malformed lines ----------------------------------------------------------------------


MALFORMED: list[dict[str, Any] | str | bytes] = [
    console(execution="worker-a"),  # 1
    '{"kind": "claim.approved", "decision": "appr',  # 2: cut short
    "",  # 3: blank, not malformed
    "[1, 2, 3]",  # 4: not an object
    console(fp=None),  # 5: approved without a fingerprint
    console("claim.approved", decision="replayed"),  # 6: kind and decision disagree
    b"\xff\xfe not utf-8",  # 7
    console(execution="x" * 300),  # 8: overlong execution id
]


def test_malformed_lines_are_reported_by_number_and_the_scan_goes_on(tmp_path: Path) -> None:
    data = ndjson([*MALFORMED, console(execution="worker-b")])

    result = run(tmp_path, data)

    assert result.code == 1  # the replay on line 9 is found after them
    assert result.err.splitlines() == [
        "line 2: invalid JSON: Unterminated string starting at (column 40); skipped",
        "line 4: not a JSON object; skipped",
        "line 5: approved decision with no fingerprint; skipped",
        "line 6: kind claim.approved without decision approved; skipped",
        "line 7: not UTF-8; skipped",
        "line 8: approved decision with an overlong execution id; skipped",
    ]
    assert "6 malformed lines skipped" in result.out
    assert "worker-b (1 decision, first line 9)" in result.out


def test_malformed_lines_without_a_replay_exit_3_unless_tolerated(tmp_path: Path) -> None:
    data = ndjson(MALFORMED)

    strict = run(tmp_path, data)
    tolerant = run(tmp_path, data, "--max-skipped", "6")
    listed = run(tmp_path, data, "--max-errors", "2", "--json")

    assert strict.code == 3
    assert "Not proven clean: malformed lines were skipped (exit 3)." in strict.out
    assert tolerant.code == 0
    assert listed.code == 3
    assert listed.document["exit_code"] == 3
    assert listed.document["summary"]["skipped_lines"] == 6
    assert [s["line"] for s in listed.document["skipped"]] == [2, 4]
    assert listed.err.splitlines()[-1].startswith("further malformed lines are counted")


def test_an_unreadable_file_exits_2(tmp_path: Path) -> None:
    result = run_command(str(tmp_path / "missing.ndjson"))

    assert result.code == 2
    assert "Cannot read" in result.err


# --- secrets ------------------------------------------------------------------------------


def test_no_token_is_ever_printed(tmp_path: Path) -> None:
    raw = tokens.mint(tokens.APPROVAL_TOKEN_PREFIX)
    runtime_key = tokens.mint(tokens.RUNTIME_KEY_PREFIX)
    data = ndjson(
        [
            console(execution="worker-a", token=raw),  # carries the token beside its fields
            console(execution="worker-b", token=raw),  # a replay, to be printed
            console(fp=raw, execution="worker-c"),  # a token where the fingerprint goes
            console(execution=f"worker-{raw}"),  # a token inside an execution id
            console(execution=runtime_key),
            console(f"claim.{raw}", execution="worker-d", decision="approved"),
            f'{{"token": "{raw}", "decision": approved}}',  # invalid JSON around a token
            f'{{"token": "{raw}"',
            f'["{raw}"]',
            raw,
        ]
    )

    for args in ((), ("--json",)):
        result = run(tmp_path, data, *args)
        assert result.code == 1
        shown = result.out + result.err
        assert raw not in shown
        assert raw[4:20] not in shown
        assert "apv_" not in shown
        assert runtime_key not in shown
        assert f"replay fingerprint {FP_A}" in result.out or FP_A in result.out
        assert "line 3: approved decision with a token-like (not shown) fingerprint" in result.err


# --- standard input -----------------------------------------------------------------------


def test_dash_reads_standard_input_of_the_real_command() -> None:
    data = ndjson([article(execution="exec-1"), article(execution="exec-2")])

    result = subprocess.run(
        [sys.executable, str(MANAGE), "find_approval_replays", "-"],
        input=data,
        capture_output=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )

    assert result.returncode == 1, result.stderr
    assert f"replay fingerprint {FP_A}: 2 approved executions" in result.stdout.decode()


def test_dash_reads_the_stdin_given_to_call_command() -> None:
    result = run_command("-", "--json", stdin=io.BytesIO(ndjson([console()])))

    assert result.code == 0
    assert result.document["summary"]["lines"] == 1


# --- the reader ---------------------------------------------------------------------------


def scan_bytes(data: bytes, **kwargs: Any) -> tuple[replay_scan.ScanResult, list[tuple[int, str]]]:
    skipped: list[tuple[int, str]] = []
    result = replay_scan.scan(
        io.BytesIO(data), on_skip=lambda n, r: skipped.append((n, r)), **kwargs
    )
    return result, skipped


@pytest.mark.parametrize("chunk_size", [1, 2, 7, 64, 4096, 1 << 20])
def test_lines_spanning_chunks_read_the_same(chunk_size: int) -> None:
    rows = [
        *MALFORMED,
        console(execution="worker-b"),
        article(fp=FP_B),
        article(fp=FP_B, execution="e2"),
    ]
    data = b"\xef\xbb\xbf" + ndjson(rows).replace(b"\n", b"\r\n", 3)[:-1]  # BOM, CRLF, no final \n

    result, skipped = scan_bytes(data, chunk_size=chunk_size)
    reference, reference_skipped = scan_bytes(data)

    assert result.lines == reference.lines == len(rows)
    assert skipped == reference_skipped
    assert [n for n, _ in skipped] == [2, 4, 5, 6, 7, 8]
    assert [f.fingerprint for f in result.replays] == [FP_A, FP_B]
    assert result.blank_lines == 1


def test_an_overlong_line_is_skipped_without_holding_it() -> None:
    long_line = json.dumps(console(execution="worker-b", data={"pad": "x" * 5000}))
    data = ndjson([console(), long_line, console(fp=FP_B), long_line])

    result, skipped = scan_bytes(data, chunk_size=64, max_line_bytes=1000)

    assert skipped == [(2, "line too long"), (4, "line too long")]
    assert result.lines == 4
    assert result.replays == []
    assert result.fingerprints == 2


def test_ids_are_quoted_when_they_could_mislead_a_terminal(tmp_path: Path) -> None:
    data = ndjson([console(execution="worker-a"), console(execution="evil\nline 1: fine")])

    result = run(tmp_path, data)

    assert result.code == 1
    assert '"evil\\nline 1: fine" (1 decision, first line 2)' in result.out


# --- memory -------------------------------------------------------------------------------

PEAK_RSS_WRAPPER = """
import atexit, runpy, sys
def report():
    with open("/proc/self/status") as status:
        peak = next(line for line in status if line.startswith("VmHWM:"))
    sys.stderr.write("PEAK_RSS_KB " + peak.split()[1] + "\\n")
atexit.register(report)
sys.argv = ["manage.py", "find_approval_replays", "-"]
runpy.run_path(MANAGE_PATH, run_name="__main__")
"""


def peak_rss_kb(blocks: Iterator[bytes]) -> tuple[int, str]:
    """The command's peak RSS (VmHWM: its own, not the parent's) reading ``blocks`` on stdin."""
    code = PEAK_RSS_WRAPPER.replace("MANAGE_PATH", repr(str(MANAGE)))
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdin is not None

    def feed() -> None:
        assert proc.stdin is not None
        try:
            for block in blocks:
                proc.stdin.write(block)
        finally:
            proc.stdin.close()

    writer = threading.Thread(target=feed)
    writer.start()
    # Not communicate(): it would close stdin under the writer. The output is a few lines.
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    proc.wait(timeout=300)
    writer.join()
    assert proc.returncode == 0, err.decode()[-2000:]
    peak = [line for line in err.decode().splitlines() if line.startswith("PEAK_RSS_KB ")]
    return int(peak[-1].split()[1]), out.decode()


def audit_file(lines: int, fingerprints: int) -> Iterator[bytes]:
    """``lines`` lines: each fingerprint approved once, then denials and other events."""
    approvals = [
        json.dumps(console(fp=f"{n:016x}", execution=f"worker-{n}")).encode() + b"\n"
        for n in range(fingerprints)
    ]
    filler = [
        json.dumps(row).encode() + b"\n"
        for row in (
            console("claim.replayed", execution="intruder"),
            console("claim.duplicate_delivery", execution="worker-0"),
            console("effect.committed", execution=None, data={"receipt": "re_1"}),
            article("issued", event="approval_issued", execution="exec-1"),
        )
    ]
    yield b"".join(approvals)
    remaining = lines - fingerprints
    block = b"".join(filler) * 2500  # 10,000 lines
    while remaining >= 10_000:
        yield block
        remaining -= 10_000
    yield b"".join(filler[n % 4] for n in range(remaining))


@pytest.mark.slow  # scans files of a million lines in processes of their own
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_memory_stays_flat_as_the_file_grows() -> None:
    small, out_small = peak_rss_kb(audit_file(100_000, 2_000))
    large, out_large = peak_rss_kb(audit_file(1_000_000, 2_000))

    assert "Scanned 100,000 lines" in out_small
    assert "Scanned 1,000,000 lines" in out_large
    assert "2,000 approved claim decisions under 2,000 fingerprints" in out_large
    # Ten times the lines (~450 MB more input): the peak may not move by more than noise.
    # Keeping even 8 bytes per line would add more than this.
    assert large - small < 6_000, (small, large)


@pytest.mark.slow  # scans files of 200,000 lines in processes of their own
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_memory_per_approved_fingerprint_is_small() -> None:
    few, _ = peak_rss_kb(audit_file(200_000, 1_000))
    many, out = peak_rss_kb(audit_file(200_000, 200_000))

    assert "under 200,000 fingerprints" in out
    per_fingerprint = (many - few) * 1024 / 199_000
    assert per_fingerprint < 400, per_fingerprint  # about 200 bytes on CPython 3.11
