"""bench/replay_scan_bench.py runs end to end at a tiny size, so that it cannot rot unnoticed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the benchmark as a process

BENCH = Path(__file__).resolve().parents[2] / "bench" / "replay_scan_bench.py"


def run_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The subprocesses inherit the test run's SECRET_KEY (the command loads the settings).
    return subprocess.run(
        [sys.executable, str(BENCH), "--lines", "3000", "--dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_replay_scan_bench_prints_rates_ratio_and_rss_at_tiny_size(tmp_path: Path) -> None:
    result = run_bench(tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"^generated [\d,]+ lines .* 4 seeded replays, \d+ duplicated", out, re.M), out
    header = next(line for line in out.splitlines() if line.startswith("arm "))
    assert header.split() == ["arm", "lines/s", "seconds", "peak", "RSS", "MiB", "growth", "MiB"]
    for label in ("baseline: json.loads per line", "parse floor: scan_once per line", "scanner"):
        row = next((line for line in out.splitlines() if line.startswith(label)), None)
        assert row is not None, f"no row for {label!r} in:\n{out}"
        rate, seconds, peak, growth = row.split()[-4:]
        assert int(rate.replace(",", "")) > 0
        assert float(seconds) > 0
        assert float(peak) > 0
        assert float(growth) >= 0
    assert re.search(r"^ratio scanner/baseline: \d+\.\d\d \(aim >= 0\.80\)$", out, re.M), out
    assert re.search(r"^approved fingerprints held: [\d,]+, about [\d,]+ bytes each$", out, re.M)
    assert "manage.py find_approval_replays --json" in out
    assert "findings correct: 4 replays" in out
    assert "apv_" not in out + result.stderr
    assert list(tmp_path.iterdir()) == []  # the generated file is removed


def test_replay_scan_bench_fails_when_the_findings_are_wrong(tmp_path: Path) -> None:
    # The bench expects one replay more than it seeded: its check must say so and fail.
    result = run_bench(tmp_path, "--inject-error", "--skip-command")

    assert result.returncode == 1, result.stdout + result.stderr
    assert "findings WRONG:" in result.stdout
    assert "replays differ" in result.stdout
