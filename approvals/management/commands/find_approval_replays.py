"""``find_approval_replays FILE``: which token fingerprints authorized more than one execution.

Exit codes:

* 0: every line was read and no fingerprint has more than one approved execution;
* 1: at least one fingerprint has approved decisions for two or more distinct executions
  (a control failure), whatever else the file holds;
* 2: the input could not be read (or the arguments are wrong);
* 3: no replay in what could be read, but more than ``--max-skipped`` lines (default 0)
  were malformed and skipped: a truncated or corrupt export is not proof that nothing
  happened, so it does not pass for clean.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.audit import replay_scan
from approvals.audit.replay_scan import Finding, ScanResult, show_id

EXIT_CLEAN = 0
EXIT_REPLAY = 1
EXIT_UNREADABLE = 2
EXIT_INCOMPLETE = 3


class Command(BaseCommand):
    help = (
        "Scan NDJSON audit exports (this console's /api/v1/audit/events lines and "
        '{"event": "approval_decision"} lines) for token fingerprints with approved '
        "decisions for more than one execution. Exit 1 when one is found, 0 when none, "
        "3 when none but malformed lines were skipped, 2 when the file cannot be read. "
        "Prints fingerprints and execution ids, never a token."
    )
    # Reads a file; needs neither the database nor the system checks.
    requires_system_checks: list[str] = []
    # call_command(..., stdin=BytesIO(...)) stands in for standard input in tests.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", metavar="FILE", help="An NDJSON export, or - for stdin.")
        parser.add_argument(
            "--json", action="store_true", help="One JSON document on stdout instead of text."
        )
        parser.add_argument(
            "--max-skipped",
            type=int,
            default=0,
            metavar="N",
            help="Tolerate up to N malformed lines before exiting 3 (default 0).",
        )
        parser.add_argument(
            "--max-errors",
            type=int,
            default=100,
            metavar="N",
            help="List at most N malformed lines on stderr; the rest are only counted "
            "(default 100).",
        )
        parser.add_argument(
            "--max-line-bytes",
            type=int,
            default=replay_scan.MAX_LINE_BYTES,
            metavar="N",
            help="Skip longer lines without holding them in memory (default 8 MiB).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        listed: list[dict[str, Any]] = []
        max_errors: int = options["max_errors"]
        if options["max_line_bytes"] < 1:
            raise CommandError("--max-line-bytes must be positive.", returncode=EXIT_UNREADABLE)

        def on_skip(line: int, reason: str) -> None:
            # The reason is the scanner's own fixed text, never the line's content.
            if len(listed) < max_errors:
                listed.append({"line": line, "reason": reason})
                self.stderr.write(f"line {line}: {reason}; skipped")
                if len(listed) == max_errors:
                    self.stderr.write(
                        "further malformed lines are counted, not listed (--max-errors)"
                    )

        path: str = options["file"]
        try:
            if path == "-":
                stdin = options.get("stdin")
                if stdin is None:
                    stdin = sys.stdin.buffer
                result = replay_scan.scan(
                    stdin, on_skip=on_skip, max_line_bytes=options["max_line_bytes"]
                )
            else:
                with open(path, "rb") as stream:
                    result = replay_scan.scan(
                        stream, on_skip=on_skip, max_line_bytes=options["max_line_bytes"]
                    )
        except OSError as error:
            raise CommandError(
                f"Cannot read {path}: {error.strerror or type(error).__name__}.",
                returncode=EXIT_UNREADABLE,
            ) from None

        code = exit_code(result, options["max_skipped"])
        if options["json"]:
            document = {
                "exit_code": code,
                "replays": [f.as_dict() for f in result.replays],
                "reapproved": [f.as_dict() for f in result.reapproved],
                "summary": result.summary(),
                "skipped": listed,
            }
            self.stdout.write(json.dumps(document, indent=2))
        else:
            for finding in result.replays:
                self.stdout.write(describe(finding, "replay"))
            for finding in result.reapproved:
                self.stdout.write(describe(finding, "reapproved"))
            self.stdout.write(summarize(result, code))
        if code:
            raise SystemExit(code)


def exit_code(result: ScanResult, max_skipped: int) -> int:
    if result.replays:
        return EXIT_REPLAY
    if result.skipped_lines > max_skipped:
        return EXIT_INCOMPLETE
    return EXIT_CLEAN


def plural(count: int, word: str, last_plural: str = "") -> str:
    """``plural(2, "audit row")`` is "2 audit rows"; ``last_plural`` replaces the last word."""
    if count == 1:
        return f"{count:,} {word}"
    head, _, last = word.rpartition(" ")
    return f"{count:,} {head + ' ' if head else ''}{last_plural or last + 's'}"


def describe(finding: Finding, label: str) -> str:
    parts = []
    for tally in finding.executions:
        counts = plural(tally.decisions, "decision")
        if tally.deliveries != tally.decisions:
            counts += f" in {plural(tally.deliveries, 'audit row')}"
        parts.append(f"{show_id(tally.execution_id)} ({counts}, first line {tally.first_line})")
    if label == "replay":
        head = f"{len(finding.executions)} approved executions"
    else:
        head = "one execution approved by several distinct decisions"
    return f"{label} fingerprint {show_id(finding.fingerprint)}: {head}: {', '.join(parts)}"


def summarize(result: ScanResult, code: int) -> str:
    s = result.summary()
    text = (
        f"Scanned {plural(s['lines'], 'line')} ({plural(s['bytes'], 'byte')}): "
        f"{plural(s['approved_decisions'], 'approved claim decision')} under "
        f"{plural(s['fingerprints'], 'fingerprint')}; "
        f"{plural(s['duplicate_deliveries'], 'duplicated audit delivery', 'deliveries')}"
        " not counted; "
        f"{plural(s['skipped_lines'], 'malformed line')} skipped."
    )
    if result.replays:
        text += (
            f" REPLAY: {plural(len(result.replays), 'fingerprint')}"
            " with more than one approved execution."
        )
    else:
        text += " No fingerprint has more than one approved execution."
    if result.reapproved:
        text += (
            f" {plural(len(result.reapproved), 'fingerprint')} approved one execution more"
            " than once (not counted as a replay; the guard should have said"
            " duplicate_delivery)."
        )
    if code == EXIT_INCOMPLETE:
        text += " Not proven clean: malformed lines were skipped (exit 3)."
    return text
