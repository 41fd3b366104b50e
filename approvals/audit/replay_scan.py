"""Find approval fingerprints that authorized more than one execution, in NDJSON audit exports.

Reads two formats, line by line, mixed freely:

* this console's ``GET /api/v1/audit/events`` lines
  (``approvals.audit.export.audit_event_line``): a claim
  that won is ``{"kind": "claim.approved", "decision": "approved", "token_fingerprint": ...,
  "execution_id": ..., "event_id": <producer event id>, "cursor": <ingestion id>, ...}``;
* the background article's ``{"event": "approval_decision", "decision": "approved",
  "token_fingerprint": ..., "execution_id": ...}`` lines (``fingerprint``, ``execution`` and
  a producer id in ``event_id``/``producer_event_id``/``decision_id`` are read too).

A *replay* is one fingerprint with approved decisions for more than one distinct execution
id: the claim guard let two executions through. Rows repeating a producer event id for the
same execution are one decision delivered twice (duplicated audit delivery), never a replay;
``duplicate_delivery`` / ``replayed`` decisions are the guard working and are not counted.

Memory: one bounded line at a time (``max_line_bytes``) plus one entry per fingerprint that
has an approved decision (one short string, about 220 bytes with its key and dict slot; a
fuller tally only for the few fingerprints seen approved more than once). Nothing is kept
per line: memory follows the number of approved fingerprints, not the size of the file.

Secrets: nothing read from a line is ever echoed except fingerprints and execution ids, and
an approved decision whose fingerprint or execution id looks like a raw token (``apv_``
anywhere, or a ``rk_`` runtime key prefix) is skipped as malformed without showing it. Error
messages name the line number and a fixed reason, never the line's content.

No Django import here: ``bench/replay_scan_bench.py`` runs this module in a bare process.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

APPROVED = "approved"
CLAIM_APPROVED_KIND = "claim.approved"
ARTICLE_EVENT = "approval_decision"

FINGERPRINT_KEYS = ("token_fingerprint", "fingerprint")
EXECUTION_KEYS = ("execution_id", "execution")
EVENT_ID_KEYS = ("event_id", "producer_event_id", "decision_id")

CHUNK_SIZE = 1 << 20
MAX_LINE_BYTES = 8 << 20
MAX_ID_CHARS = 256

# Line stand-ins the reader hands over instead of bytes it could not use. Compared by
# identity: a line read from a file is a new object even when its text is equal.
TOO_LONG = "\0<line too long>"
NOT_UTF8 = "\0<not utf-8>"

_NOTHING: Any = object()
_SAFE_ID = re.compile(r"[A-Za-z0-9_.:@/+=#-]+")

# The C scanner behind json.loads, without json.loads' Python wrapper (a BOM check and two
# regex matches per call, a third of the parse time on a typical audit line). Same parser,
# same results; a line it refuses goes through json.loads for the error message.
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def looks_like_secret(value: str) -> bool:
    """An approval token (``apv_...``) or a runtime key (``rk_...``)."""
    return "apv_" in value or value.startswith("rk_")


def show_id(value: str) -> str:
    """An id as printed in text output: bare when harmless, else JSON-quoted (ASCII)."""
    return value if _SAFE_ID.fullmatch(value) else json.dumps(value)


# --- reading ----------------------------------------------------------------------------


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


def iter_line_blocks(
    stream: Readable, *, chunk_size: int = CHUNK_SIZE, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[list[str]]:
    """The stream's lines without their ``\\n``, in order, a block per chunk read.

    Reads binary chunks and decodes each block of whole lines once (a block that is not
    valid UTF-8 is decoded line by line, the bad lines replaced by ``NOT_UTF8``). A line
    longer than ``max_line_bytes`` is dropped while it is read and replaced by ``TOO_LONG``,
    so memory stays bounded by the chunk size plus ``max_line_bytes`` whatever the input.
    Every line of the input, blank ones included, yields exactly one entry.
    """
    read = stream.read
    carry = b""
    discarding = False  # inside a line already known to be too long
    first = True
    while True:
        chunk = read(chunk_size)
        if not chunk:
            break
        cut = chunk.rfind(b"\n")
        if cut < 0:
            if not discarding:
                carry += chunk
                if len(carry) > max_line_bytes:
                    carry, discarding = b"", True
            continue
        block = carry + chunk[:cut] if carry else chunk[:cut]
        carry = chunk[cut + 1 :]
        lines = _decode(block, first)
        first = False
        if discarding:  # this block's first line ends the long one
            lines[0] = TOO_LONG
            discarding = False
        if len(carry) > max_line_bytes:  # only with chunks larger than the limit
            carry, discarding = b"", True
        yield lines
    if discarding:
        yield [TOO_LONG]
    elif carry:
        yield _decode(carry, first)


def _decode(block: bytes, first: bool) -> list[str]:
    if first and block.startswith(b"\xef\xbb\xbf"):
        block = block[3:]
    try:
        return block.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = []
        for raw in block.split(b"\n"):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                lines.append(NOT_UTF8)
        return lines


# --- results ----------------------------------------------------------------------------


@dataclass
class ExecutionTally:
    """The approved decisions one execution got for one fingerprint."""

    execution_id: str
    first_line: int
    decisions: int = 0  # distinct producer decisions (a row without an event id is one)
    deliveries: int = 0  # audit rows, duplicated deliveries included
    _event_keys: set[str] = field(default_factory=set, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "decisions": self.decisions,
            "deliveries": self.deliveries,
            "first_line": self.first_line,
        }


@dataclass
class Finding:
    """One fingerprint and the executions approved under it."""

    fingerprint: str
    executions: list[ExecutionTally]

    def as_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "executions": [e.as_dict() for e in self.executions],
        }


@dataclass
class ScanResult:
    lines: int
    bytes_read: int
    blank_lines: int
    approved_rows: int  # approved claim rows as read
    duplicate_deliveries: int  # rows repeating a producer event id: not decisions
    fingerprints: int  # fingerprints with at least one approved decision
    skipped_lines: int
    replays: list[Finding]  # more than one approved execution: the control failed
    # One execution approved by more than one distinct producer decision: not a replay by
    # the execution count, but the guard should have answered duplicate_delivery.
    reapproved: list[Finding]

    @property
    def approved_decisions(self) -> int:
        return self.approved_rows - self.duplicate_deliveries

    def summary(self) -> dict[str, int]:
        return {
            "lines": self.lines,
            "bytes": self.bytes_read,
            "blank_lines": self.blank_lines,
            "skipped_lines": self.skipped_lines,
            "approved_rows": self.approved_rows,
            "approved_decisions": self.approved_decisions,
            "duplicate_deliveries": self.duplicate_deliveries,
            "fingerprints": self.fingerprints,
            "replays": len(self.replays),
            "reapproved": len(self.reapproved),
        }


# --- scanning ---------------------------------------------------------------------------


class _Tally:
    """The state of a fingerprint approved more than once (rare): executions by id."""

    __slots__ = ("executions",)

    def __init__(self) -> None:
        self.executions: dict[str, ExecutionTally] = {}

    def add(self, execution_id: str, event_key: str, line: int) -> bool:
        """Count one approved row; True when it repeats a producer event id already seen."""
        tally = self.executions.get(execution_id)
        if tally is None:
            tally = self.executions[execution_id] = ExecutionTally(execution_id, line)
        tally.deliveries += 1
        if event_key:
            if event_key in tally._event_keys:
                return True
            tally._event_keys.add(event_key)
        tally.decisions += 1
        return False


class ReplayScanner:
    """Feed it blocks of lines (``iter_line_blocks``); ask for the ``result()``.

    ``on_skip(line_number, reason)`` hears of every line that cannot be used, as it is found.
    """

    def __init__(self, on_skip: Callable[[int, str], None] | None = None) -> None:
        self._on_skip = on_skip
        # fingerprint -> "line\tevent key\texecution id" for a fingerprint approved once (one
        # str: some 100 bytes less than a tuple of three), a _Tally once approved again
        self._state: dict[str, str | _Tally] = {}
        self.lines = 0
        self.blank_lines = 0
        self.skipped_lines = 0
        self.approved_rows = 0
        self.duplicate_deliveries = 0

    def feed(self, lines: Iterable[str]) -> None:
        scan_once = _scan_once
        approved = APPROVED
        lineno = self.lines
        for line in lines:
            lineno += 1
            try:
                obj, end = scan_once(line, 0)
                if end != len(line) and line[end:].strip(" \t\r"):
                    raise ValueError("extra data")
            except (StopIteration, ValueError, RecursionError):
                obj = self._parse_slowly(line, lineno)
                if obj is _NOTHING:
                    continue
            try:
                decision = obj.get("decision")
            except AttributeError:
                self._skip(lineno, "not a JSON object")
                continue
            if decision == approved:
                self._approved(obj, lineno)
            elif obj.get("kind") == CLAIM_APPROVED_KIND:
                self._skip(lineno, "kind claim.approved without decision approved")
        self.lines = lineno

    def _skip(self, lineno: int, reason: str) -> None:
        self.skipped_lines += 1
        if self._on_skip is not None:
            self._on_skip(lineno, reason)

    def _parse_slowly(self, line: str, lineno: int) -> Any:
        """The object of a line the fast path refused, or _NOTHING (blank or reported)."""
        if line is TOO_LONG:
            self._skip(lineno, "line too long")
            return _NOTHING
        if line is NOT_UTF8:
            self._skip(lineno, "not UTF-8")
            return _NOTHING
        if not line.strip(" \t\r"):
            self.blank_lines += 1
            return _NOTHING
        try:
            return json.loads(line)
        except json.JSONDecodeError as error:
            # The message is json's own fixed text; the column, not the content around it.
            self._skip(lineno, f"invalid JSON: {error.msg} (column {error.colno})")
        except RecursionError:
            self._skip(lineno, "invalid JSON: nested too deeply")
        except ValueError:
            self._skip(lineno, "invalid JSON: a value out of range")
        return _NOTHING

    def _approved(self, obj: dict[str, Any], lineno: int) -> None:
        event = obj.get("event")
        if event is not None:
            if event != ARTICLE_EVENT:
                return  # the article's other events: not a claim decision
        else:
            kind = obj.get("kind")
            if kind is not None and kind != CLAIM_APPROVED_KIND:
                if isinstance(kind, str) and kind.startswith("claim."):
                    self._skip(lineno, "decision approved under another claim kind")
                return  # approved, but not a claim (another producer's own event)
        fingerprint = _first(obj, FINGERPRINT_KEYS)
        problem = _id_problem(fingerprint)
        if problem:
            self._skip(lineno, f"approved decision with {problem} fingerprint")
            return
        execution_id = _first(obj, EXECUTION_KEYS)
        problem = _id_problem(execution_id)
        if problem:
            self._skip(lineno, f"approved decision with {problem} execution id")
            return
        self.approved_rows += 1
        event_key = _event_key(_first(obj, EVENT_ID_KEYS))
        state = self._state.get(fingerprint)
        if state is None:
            self._state[fingerprint] = f"{lineno}\t{event_key}\t{execution_id}"
            return
        if isinstance(state, str):
            first_line, first_key, first_execution = state.split("\t", 2)
            state = self._state[fingerprint] = _Tally()
            state.add(first_execution, first_key, int(first_line))
        if state.add(execution_id, event_key, lineno):
            self.duplicate_deliveries += 1

    def result(self, bytes_read: int = 0) -> ScanResult:
        replays: list[Finding] = []
        reapproved: list[Finding] = []
        for fingerprint, state in self._state.items():
            if isinstance(state, str):
                continue
            executions = sorted(state.executions.values(), key=lambda e: e.first_line)
            if len(executions) > 1:
                replays.append(Finding(fingerprint, executions))
            elif executions[0].decisions > 1:
                reapproved.append(Finding(fingerprint, executions))
        for findings in (replays, reapproved):
            findings.sort(key=lambda f: f.executions[0].first_line)
        return ScanResult(
            lines=self.lines,
            bytes_read=bytes_read,
            blank_lines=self.blank_lines,
            approved_rows=self.approved_rows,
            duplicate_deliveries=self.duplicate_deliveries,
            fingerprints=len(self._state),
            skipped_lines=self.skipped_lines,
            replays=replays,
            reapproved=reapproved,
        )


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = obj.get(key)
        if value is not None and value != "":
            return value
    return None


def _id_problem(value: Any) -> str:
    """Why a fingerprint or execution id cannot be used and printed; "" when it can."""
    if not isinstance(value, str) or not value:
        return "no"
    if len(value) > MAX_ID_CHARS:
        return "an overlong"
    if looks_like_secret(value):
        return "a token-like (not shown)"
    return ""


def _event_key(event_id: Any) -> str:
    """What identifies a producer event for dedupe, in a few bytes; "" when absent.

    Only compared with the keys of the same fingerprint and execution, so a 64-bit hash
    suffices: a collision there could only merge two decisions of one execution in the
    counts, never hide a second execution.
    """
    if isinstance(event_id, str):
        return str(hash(event_id))
    if event_id is None:
        return ""
    return str(hash(json.dumps(event_id, sort_keys=True)))


class _Counting:
    """A binary stream wrapper that counts the bytes read."""

    def __init__(self, stream: Readable) -> None:
        self._stream = stream
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.count += len(data)
        return data


def scan(
    stream: Readable,
    *,
    on_skip: Callable[[int, str], None] | None = None,
    chunk_size: int = CHUNK_SIZE,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> ScanResult:
    """Scan a binary stream of NDJSON audit lines to its end."""
    counting = _Counting(stream)
    scanner = ReplayScanner(on_skip)
    blocks = iter_line_blocks(
        counting,
        chunk_size=chunk_size,
        max_line_bytes=max_line_bytes,
    )
    for block in blocks:
        scanner.feed(block)
    return scanner.result(bytes_read=counting.count)
