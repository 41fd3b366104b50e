"""How fast does ``find_approval_replays`` scan an audit export, next to merely parsing it?

    .venv/bin/python bench/replay_scan_bench.py [--lines 2000000] [--repeat 1] [--dir DIR]

Generates an NDJSON file of both formats the scanner reads (this console's
``/api/v1/audit/events`` lines and the article's ``{"event": "approval_decision"}`` lines),
mixed: per approval the proposal, vote, issuance, token pickup, the winning claim, effect
events, and now and then a healthy redelivery (``duplicate_delivery``), a denied replay
(``replayed``) and a duplicated audit delivery (the same producer event id ingested twice).
It seeds a few real replays (a second, even a third, approved execution for one
fingerprint, one of them across the two formats) and a few malformed lines, one of them
carrying a raw token.

Then, each in a fresh process so that peak RSS is its own, on the same file, in the page
cache:

* ``baseline``: the scanner's own reading loop (binary chunks, decoded per block) and
  ``json.loads`` on every line, nothing else. The ratio is measured against this.
* ``floor``: the same loop with the C scanner that ``json.loads`` wraps and the scanner
  uses (``JSONDecoder.scan_once``): parsing alone, the scanner's lower bound.
* ``orjson``: the same loop with ``orjson.loads``, only when orjson is importable (it is
  not a dependency; this arm says what adding it would buy).
* ``scanner``: ``approvals.audit.replay_scan.scan``, the code the management command runs.

It prints lines/s per arm, the ratio scanner / baseline (aim >= 0.8), peak RSS per arm and
its growth over the process's RSS before the scan, then runs
``manage.py find_approval_replays FILE --json`` once. It exits 1 if the scanner's or the
command's findings differ from what was seeded (replays, duplicated deliveries, skipped
lines, exit code), or if a token appears in the command's output.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from approvals.audit import replay_scan

TOKEN_IN_A_BAD_LINE = "apv_" + "bench0nly" + "x" * 34  # never to appear in any output

# --- the generated file -----------------------------------------------------------------

CONSOLE = (
    '{"actor": %s, "command_id": %s, "cursor": %d, "data": %s, "decision": %s, '
    '"event_id": "%s", "execution_id": %s, "ingested_at": "%s", "kind": "%s", '
    '"message_id": %s, "occurrence_id": "%s", "reason_code": %s, "source_time": "%s", '
    '"token_fingerprint": %s, "trace_id": %s}\n'
)
ARTICLE = (
    '{"event": "%s", "event_id": "%s", "tenant_id": "shop-%d", "token_fingerprint": "%s", '
    '"decision": %s, "reason": %s, "execution_id": %s, "message_id": %s, "command_id": %s, '
    '"trace_id": "%s", "source_time": "%s"}\n'
)


def _q(value: str | None) -> str:
    return "null" if value is None else '"' + value + '"'


@dataclass
class Expected:
    replays: dict[str, set[str]] = field(default_factory=dict)
    approved_fingerprints: set[str] = field(default_factory=set)
    duplicate_deliveries: int = 0
    malformed: int = 0
    lines: int = 0


class Writer:
    """Emits both formats, counting lines, buffering writes."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.buffer: list[str] = []
        self.lines = 0
        self.cursor = 0
        self.events = 0

    def emit(self, line: str) -> None:
        self.buffer.append(line)
        self.lines += 1
        if len(self.buffer) >= 20_000:
            self.flush()

    def flush(self) -> None:
        self.out.write("".join(self.buffer).encode())
        self.buffer.clear()

    def event_id(self) -> str:
        self.events += 1
        n = self.events
        return f"{n:08x}-{n & 0xFFFF:04x}-4007-8000-{n:012x}"

    def stamp(self) -> str:
        s = self.cursor
        return (
            f"2026-03-{1 + s // 86_400 % 28:02d}T{s // 3600 % 24:02d}:{s // 60 % 60:02d}:"
            f"{s % 60:02d}.{s * 7919 % 1_000_000:06d}+00:00"
        )

    def console(
        self,
        kind: str,
        story: int,
        fp: str | None = None,
        decision: str | None = None,
        execution: str | None = None,
        command: str | None = None,
        reason: str | None = None,
        data: str = "{}",
        actor: str = "runtime",
        event_id: str | None = None,
        source_time: str | None = None,
    ) -> tuple[str, str]:
        """Emit one console line; return its producer event id and source time."""
        self.cursor += 1
        stamp = self.stamp()
        event_id = event_id or self.event_id()
        source_time = source_time or stamp
        line = CONSOLE % (
            _q(actor),
            _q(command),
            self.cursor,
            data,
            _q(decision),
            event_id,
            _q(execution),
            stamp,
            kind,
            _q(None if execution is None else f"msg-{story}"),
            f"{story:08x}-0000-4000-8000-{story:012x}",
            _q(reason),
            source_time,
            _q(fp),
            _q(f"{story * 2654435761:032x}"),
        )
        self.emit(line)
        return event_id, source_time

    def article(
        self,
        event: str,
        story: int,
        fp: str,
        decision: str | None = None,
        execution: str | None = None,
        command: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.cursor += 1
        self.emit(
            ARTICLE
            % (
                event,
                self.event_id(),
                story % 7,
                fp,
                _q(decision),
                _q(reason),
                _q(execution),
                _q(None if execution is None else f"msg-{story}"),
                _q(command),
                f"{story:032x}",
                self.stamp(),
            )
        )


def fingerprint(story: int) -> str:
    return f"{story * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF:016x}"


def command_id(story: int, n: int = 0) -> str:
    return f"{story:08x}-{n:04x}-4000-9000-{story:012x}"


def console_story(w: Writer, story: int, rng: random.Random, expected: Expected) -> None:
    fp = fingerprint(story)
    execution = f"worker-{story % 13}-{story}"
    w.console("occurrence.proposed", story, actor="agent", data='{"tool": "issue_refund"}')
    w.console("approval.vote_recorded", story, actor="rita", data='{"version": 1, "votes": 1}')
    w.console("approval.issued", story, fp=fp, decision="issued", actor="rita")
    w.console("token.delivered", story, fp=fp)
    claim: dict[str, Any] = {
        "fp": fp,
        "decision": "approved",
        "execution": execution,
        "command": command_id(story),
        "reason": "claimed",
        "data": f'{{"epoch": 1, "executed_by": "payments", "idempotency_key": "cmd_{story:032x}"}}',
    }
    event_id, source_time = w.console("claim.approved", story, **claim)
    expected.approved_fingerprints.add(fp)
    roll = rng.random()
    if roll < 0.10:  # a queue redelivery of the same execution: healthy
        w.console(
            "claim.duplicate_delivery",
            story,
            fp=fp,
            decision="duplicate_delivery",
            execution=execution,
            command=command_id(story),
            reason="same_execution_redelivery",
        )
    elif roll < 0.15:  # another execution tries: denied
        w.console(
            "claim.replayed",
            story,
            fp=fp,
            decision="replayed",
            execution=f"intruder-{story}",
            reason="consumed_by_other_execution",
        )
    elif roll < 0.16:  # the sink ingested the claim's event twice: one decision
        w.console("claim.approved", story, **claim, event_id=event_id, source_time=source_time)
        expected.duplicate_deliveries += 1
    w.console(
        "effect.committed",
        story,
        decision="committed",
        command=command_id(story),
        actor="adapter",
        data=f'{{"receipt": "re_{story}"}}',
    )


def article_story(w: Writer, story: int, rng: random.Random, expected: Expected) -> None:
    fp = fingerprint(story)
    execution = f"exec-{story}"
    w.article("approval_issued", story, fp, decision="issued")
    w.article(
        "approval_decision",
        story,
        fp,
        decision="approved",
        execution=execution,
        command=command_id(story),
        reason="claimed",
    )
    expected.approved_fingerprints.add(fp)
    if rng.random() < 0.1:
        w.article(
            "approval_decision",
            story,
            fp,
            decision="replayed",
            execution=f"exec-{story}-retry",
            reason="consumed_by_other_execution",
        )
    w.article("command_dispatched", story, fp, execution=execution, command=command_id(story))
    w.article("adapter_result_recorded", story, fp, command=command_id(story))


def generate(path: Path, lines: int, seed: int, inject_error: bool) -> Expected:
    """Write about ``lines`` lines; return what the scanner must find in them."""
    rng = random.Random(seed)
    expected = Expected()
    stories = max(40, lines * 100 // 564)  # 5.64 lines per story on average
    # Second (and third) approved executions, placed far from the first: story -> injections.
    plan: dict[int, list[tuple[str, int, str]]] = {}
    replayed = [stories * k // 10 for k in (1, 3, 5, 7)]
    for n, story in enumerate(replayed):
        later = min(stories - 1, story + stories // 5)
        fmt = "console" if story % 4 else "article"  # the format of the story's first claim
        if n == 1:  # the second claim in the other format
            fmt = "article" if fmt == "console" else "console"
        plan.setdefault(later, []).append((fmt, story, f"replayer-{n}"))
        if n == 2:  # three approved executions
            plan.setdefault(stories - 1, []).append((fmt, story, "replayer-2b"))
    bad_lines = [
        '{"kind": "claim.approved", "decision": "approved", "token_finger\n',
        "[1, 2, 3]\n",
        f'{{"token": "{TOKEN_IN_A_BAD_LINE}", "decision": approved}}\n',
    ]
    malformed_at = {stories * (n + 1) // 4: line for n, line in enumerate(bad_lines)}
    with open(path, "wb") as out:
        w = Writer(out)
        story = 0
        while story < stories or plan:
            if story < stories:
                (console_story if story % 4 else article_story)(w, story, rng, expected)
            for fmt, first, execution in plan.pop(story, []):
                fp = fingerprint(first)
                original = f"worker-{first % 13}-{first}" if first % 4 else f"exec-{first}"
                expected.replays.setdefault(fp, {original}).add(execution)
                if fmt == "console":
                    w.console(
                        "claim.approved",
                        first,
                        fp=fp,
                        decision="approved",
                        execution=execution,
                        command=command_id(first, 1),
                        reason="claimed",
                    )
                else:
                    w.article(
                        "approval_decision",
                        first,
                        fp,
                        decision="approved",
                        execution=execution,
                        command=command_id(first, 1),
                    )
            if story in malformed_at:
                w.emit(malformed_at[story])
                expected.malformed += 1
            story += 1
        w.flush()
        expected.lines = w.lines
    if inject_error:  # proves the check fails: a replay that is not in the file
        expected.replays[fingerprint(2)] = {"worker-2-2", "nowhere"}
    return expected


# --- the arms (each in its own process) -------------------------------------------------


def _peak_rss_kb() -> int:
    """This process's peak RSS. Linux's ``VmHWM`` belongs to the address space, so it
    starts afresh at exec; ``ru_maxrss`` (the fallback) keeps the forking parent's."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _parse_only(path: str, parse: Callable[[str], Any], errors: tuple[type[Exception], ...]) -> int:
    bad = 0
    with open(path, "rb") as stream:
        for block in replay_scan.iter_line_blocks(stream):
            for line in block:
                try:
                    parse(line)
                except errors:
                    bad += 1
    return bad


def run_arm(arm: str, path: str) -> dict[str, Any]:
    report: dict[str, Any] = {"arm": arm}
    rss_before = _peak_rss_kb()
    started = time.perf_counter()
    if arm == "scanner":
        with open(path, "rb") as stream:
            result = replay_scan.scan(stream)
        report.update(
            lines=result.lines,
            replays={f.fingerprint: [e.execution_id for e in f.executions] for f in result.replays},
            reapproved=len(result.reapproved),
            summary=result.summary(),
        )
    else:
        if arm == "baseline":
            bad = _parse_only(path, json.loads, (ValueError,))
        elif arm == "floor":
            scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
            bad = _parse_only(path, lambda s: scan_once(s, 0), (ValueError, StopIteration))
        elif arm == "orjson":
            import orjson

            bad = _parse_only(path, orjson.loads, (ValueError,))
        else:
            raise SystemExit(f"no arm {arm}")
        report["bad"] = bad
    report["seconds"] = time.perf_counter() - started
    report["rss_before_kb"] = rss_before
    report["rss_peak_kb"] = _peak_rss_kb()
    return report


def child(arm: str, path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--arm", arm, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"arm {arm} failed:\n{out.stderr}")
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def orjson_available() -> bool:
    try:
        import orjson  # noqa: F401
    except ImportError:
        return False
    return True


# --- the run --------------------------------------------------------------------------


def check_scanner(report: dict[str, Any], expected: Expected) -> list[str]:
    wrong = []
    found = {fp: set(executions) for fp, executions in report["replays"].items()}
    if found != expected.replays:
        missing = sorted(set(expected.replays) - set(found))
        extra = sorted(set(found) - set(expected.replays))
        wrong.append(f"replays differ: missing {missing}, unexpected {extra}, or executions")
    s = report["summary"]
    for key, want in (
        ("duplicate_deliveries", expected.duplicate_deliveries),
        ("skipped_lines", expected.malformed),
        ("fingerprints", len(expected.approved_fingerprints)),
        ("lines", expected.lines),
        ("reapproved", 0),
    ):
        if s[key] != want:
            wrong.append(f"{key}: {s[key]} found, {want} seeded")
    return wrong


def check_command(path: Path, expected: Expected) -> tuple[list[str], float]:
    env = {**os.environ}
    if not env.get("SECRET_KEY", "").strip():
        env["SECRET_KEY"] = secrets.token_urlsafe(50)  # the command reads no secret
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "find_approval_replays", str(path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    seconds = time.perf_counter() - started
    wrong = []
    if out.returncode != (1 if expected.replays else 3):
        wrong.append(f"command exit code {out.returncode}: {out.stderr[-2000:]}")
    if "apv_" in out.stdout + out.stderr:
        wrong.append("the command's output holds a token")
    try:
        document = json.loads(out.stdout)
    except ValueError:
        return [*wrong, "the command's stdout is not JSON"], seconds
    found = {
        r["fingerprint"]: {e["execution_id"] for e in r["executions"]} for r in document["replays"]
    }
    if found != expected.replays:
        wrong.append("the command's replays differ from the seeded ones")
    if document["summary"]["skipped_lines"] != expected.malformed:
        wrong.append("the command's skipped lines differ from the seeded ones")
    stderr_lines = [line for line in out.stderr.splitlines() if line.startswith("line ")]
    if len(stderr_lines) != expected.malformed:
        wrong.append(f"{len(stderr_lines)} malformed lines on stderr, {expected.malformed} seeded")
    return wrong, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=2_000_000, help="about this many lines")
    parser.add_argument("--repeat", type=int, default=1, help="runs per arm; the best counts")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", type=Path, help="write the file here (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the generated file")
    parser.add_argument("--skip-command", action="store_true", help="skip the manage.py run")
    parser.add_argument("--inject-error", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--arm", nargs=2, metavar=("ARM", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm[0], args.arm[1])))
        return 0

    workdir = Path(tempfile.mkdtemp(prefix="replay_scan_bench_", dir=args.dir))
    path = workdir / "audit.ndjson"
    try:
        started = time.perf_counter()
        expected = generate(path, args.lines, args.seed, args.inject_error)
        size = path.stat().st_size
        print(
            f"generated {expected.lines:,} lines ({size / 2**20:,.1f} MiB) in "
            f"{time.perf_counter() - started:.1f} s: {len(expected.approved_fingerprints):,} "
            f"approved fingerprints, {len(expected.replays)} seeded replays, "
            f"{expected.duplicate_deliveries} duplicated audit deliveries, "
            f"{expected.malformed} malformed lines"
        )
        with open(path, "rb") as stream:  # into the page cache, for every arm alike
            while stream.read(1 << 23):
                pass

        arms = ["baseline", "floor", *(["orjson"] if orjson_available() else []), "scanner"]
        best: dict[str, dict[str, Any]] = {}
        for _ in range(max(1, args.repeat)):
            for arm in arms:
                report = child(arm, path)
                if arm not in best or report["seconds"] < best[arm]["seconds"]:
                    best[arm] = report
                best[arm]["rss_peak_kb"] = max(best[arm]["rss_peak_kb"], report["rss_peak_kb"])

        labels = {
            "baseline": "baseline: json.loads per line",
            "floor": "parse floor: scan_once per line",
            "orjson": "parse: orjson.loads per line",
            "scanner": "scanner: replay_scan.scan",
        }
        print(f"{'arm':34} {'lines/s':>12} {'seconds':>8} {'peak RSS MiB':>13} {'growth MiB':>11}")
        rate = {}
        for arm in arms:
            r = best[arm]
            rate[arm] = expected.lines / r["seconds"]
            growth = (r["rss_peak_kb"] - r["rss_before_kb"]) / 1024
            print(
                f"{labels[arm]:34} {rate[arm]:>12,.0f} {r['seconds']:>8.2f} "
                f"{r['rss_peak_kb'] / 1024:>13.1f} {growth:>11.1f}"
            )
        ratio = rate["scanner"] / rate["baseline"]
        print(f"ratio scanner/baseline: {ratio:.2f} (aim >= 0.80)")
        print(f"ratio scanner/floor: {rate['scanner'] / rate['floor']:.2f}")
        if "orjson" in rate:
            print(f"ratio orjson/floor: {rate['orjson'] / rate['floor']:.2f}")
        scanner_growth = best["scanner"]["rss_peak_kb"] - best["scanner"]["rss_before_kb"]
        base_growth = best["baseline"]["rss_peak_kb"] - best["baseline"]["rss_before_kb"]
        held = best["scanner"]["summary"]["fingerprints"]
        per_fp = max(0, scanner_growth - base_growth) * 1024 / max(1, held)
        print(f"approved fingerprints held: {held:,}, about {per_fp:,.0f} bytes each")

        wrong = check_scanner(best["scanner"], expected)
        if not args.skip_command:
            command_wrong, seconds = check_command(path, expected)
            wrong += command_wrong
            print(f"manage.py find_approval_replays --json: {seconds:.2f} s wall, Django included")
        if wrong:
            print("findings WRONG:")
            for problem in wrong:
                print(f"  {problem}")
            return 1
        print(
            f"findings correct: {len(expected.replays)} replays, "
            f"{expected.duplicate_deliveries} duplicated deliveries not counted, "
            f"{expected.malformed} malformed lines skipped"
        )
        return 0
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
