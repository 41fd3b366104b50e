"""bench/page_bench.py runs end to end at a tiny scale, so that it cannot rot unnoticed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

pytestmark = pytest.mark.slow  # the benchmark as a process, seeding a database

BENCH = Path(__file__).resolve().parents[2] / "bench" / "page_bench.py"


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the page bench seeds PostgreSQL with generate_series"
)
def test_page_bench_prints_its_table_at_tiny_scale() -> None:
    # Same server and credentials as the test database (DATABASE_URL); the bench creates
    # and drops a database of its own, named apart from any other run's.
    result = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--scale",
            "0.001",
            "--iterations",
            "3",
            "--warmup",
            "1",
            "--db-name",
            f"page_bench_smoke_{os.getpid()}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LOG_LEVEL": "WARNING"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "100 occurrences" in out
    # 1,000 spread over the occurrences plus the replayed token's own history.
    events = re.search(r"([\d,]+) audit events", out)
    assert events is not None, out
    assert int(events.group(1).replace(",", "")) > 1000
    header = next(line for line in out.splitlines() if line.startswith("page "))
    assert header.split() == ["page", "p50", "ms", "p95", "ms", "queries", "p50", "/", "baseline"]
    labels = [
        "baseline: trivial template",
        "inbox /reviews/",
        "review, consumed",
        "review, pending v2",
        "review, long history, final",
        "review, long history, issued",
        # Found from the pages' hx-trigger="every ..." elements: their absence means the
        # bench no longer finds what the pages poll.
        "inbox poll, unchanged (htmx)",
        "panel poll, unchanged (htmx)",
        "panel poll, long history (htmx)",
        # The operators' pages, as the bench's operator.
        "operations queue",
        "operations, long history",
        "investigation, replayed token",
    ]
    for label in labels:
        row = next((line for line in out.splitlines() if line.startswith(label)), None)
        assert row is not None, f"no row for {label!r} in:\n{out}"
        p50, p95, queries, ratio = row[len(label) :].split()
        assert float(p50) > 0
        assert float(p95) >= float(p50)
        assert int(queries) >= 1
        assert ratio.endswith("x")
