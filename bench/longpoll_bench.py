"""What 500 long-polls cost the requests that do not wait, on the ``bin/serve`` configuration.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/console_bench \\
    REDIS_URL=redis://127.0.0.1:6379/12 .venv/bin/python bench/longpoll_bench.py [--waiters 500]
    .venv/bin/python bench/longpoll_bench.py --tiny      # 20 waiters: what tests/bench runs

It starts gunicorn as ``bin/serve`` does (``config/gunicorn.conf.py``: the asgi worker,
``config/asgi.py``; DEBUG off; the rate limit out of the way, as ``http_bench`` does) and
measures, with ``http_bench``'s client (8 keep-alive connections, prebuilt requests):

  alone        GET /api/v1/occurrences/<id>, an ordinary read, with nobody waiting
  crowd        the same while ``--waiters`` long-polls (``?wait=60``) wait on other
               occurrences
  after        the same again once the waiters are answered; the baseline is the mean
               of ``alone`` and ``after`` (the first arm runs on a colder server)
  wake         then every waiter's occurrence is rejected, one after the other, through
               ``approvals.reviews.decisions.occurrence_reject`` in this process, ``--rate`` (25) a
               second: how long after each decision's commit its waiter had the answer

It prints both reads' rate and p50/p95, the ratios crowd/alone, the wake-up latencies
(p50, p95, max), the reads the server made for the waiters (``console_long_poll_reads``)
and the threads its workers ran while the crowd waited. Exits 1 if a waiter got anything
but its ``rejected`` answer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LOG_LEVEL", "WARNING")  # not a line per decision

from bench import http_bench  # sets Django up: first
from bench.http_bench import Server, make_world, request_bytes, run_http

# isort: split
import httpx
from django.db import connections
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import Occurrence, RuntimeKey
from approvals.reviews.decisions import occurrence_reject
from approvals.reviews.proposals import occurrence_propose

METRICS_TOKEN = "longpoll-bench-" + os.urandom(8).hex()


def metric(url: str, name: str) -> float:
    response = httpx.get(
        f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10
    )
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


def threads_of(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                total += int(line.split()[1])
    return total


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waiters", type=int, default=500)
    parser.add_argument("--requests", type=int, default=1000, help="ordinary reads per arm")
    parser.add_argument(
        "--rate", type=float, default=25.0, help="decisions per second (0: as fast as it can)"
    )
    parser.add_argument("--tiny", action="store_true", help="20 waiters, 100 reads")
    args = parser.parse_args(argv)
    waiters, reads = (20, 100) if args.tiny else (args.waiters, args.requests)

    info = http_bench.prepare_database()
    world = make_world()
    key = RuntimeKey.objects.get(tenant=world.tenant)
    ids = []
    for i in range(waiters + 1):
        occurrence, _ = occurrence_propose(
            runtime_key=key,
            tool="issue_refund",
            arguments=http_bench.REFUND,
            run_id=f"longpoll-{i}",
            reason="Long-poll bench",
            client_ref="call_0",
        )
        ids.append(str(occurrence.pk))
    ordinary_id, crowd = ids[0], ids[1:]

    with tempfile.TemporaryDirectory(prefix="longpoll-bench-") as tmp:
        server = Server(Path(tmp), METRICS_TOKEN=METRICS_TOKEN)
        connections.close_all()
        server.start()
        try:
            print(
                f"long-poll bench: {waiters} waiters, {reads} ordinary reads per arm over "
                f"{http_bench.CONNECTIONS} connections; gunicorn "
                f"{server.env.get('GUNICORN_WORKER_CLASS') or 'asgi'} x "
                f"{len(server.workers())} workers on {os.cpu_count()} cores; {info}"
            )
            ordinary = [
                request_bytes(
                    "GET", f"/api/v1/occurrences/{ordinary_id}", server.port, key=world.raw_key
                )
            ] * (reads + 50)
            alone = run_http(server, "alone", ordinary, warmup=50)

            answered: dict[str, tuple[float, int, str]] = {}

            async def wait_all() -> None:
                limits = httpx.Limits(max_connections=waiters + 10, max_keepalive_connections=0)
                async with httpx.AsyncClient(
                    headers={"Authorization": f"Bearer {world.raw_key}"},
                    limits=limits,
                    timeout=120,
                ) as http:

                    async def one(occurrence_id: str) -> None:
                        r = await http.get(
                            f"{server.url}/api/v1/occurrences/{occurrence_id}",
                            params={"wait": 60},
                        )
                        status = r.json().get("status", "") if r.status_code == 200 else ""
                        answered[occurrence_id] = (time.time(), r.status_code, status)

                    await asyncio.gather(*(one(i) for i in crowd))

            reads_before = metric(server.url, "console_long_poll_reads_total")
            waiting = threading.Thread(target=asyncio.run, args=(wait_all(),))
            waiting.start()
            deadline = time.monotonic() + 60
            while metric(server.url, "console_long_poll_waiting") < waiters:
                if time.monotonic() > deadline:
                    http_bench.fail(f"{waiters} long-polls were not all waiting after 60 s")
                time.sleep(0.1)
            threads = threads_of(server.workers())
            with_crowd = run_http(server, "crowd", ordinary, warmup=50)

            decided: dict[str, float] = {}
            started = time.monotonic()
            for n, occurrence_id in enumerate(crowd):
                pause = started + n / args.rate - time.monotonic() if args.rate else 0
                if pause > 0:
                    time.sleep(pause)
                occurrence_reject(
                    occurrence=Occurrence.objects.get(pk=occurrence_id),
                    reviewer=world.reviewer,
                    reason="Long-poll bench",
                )
                decided[occurrence_id] = time.time()
            waiting.join(timeout=120)
            waker_reads = metric(server.url, "console_long_poll_reads_total") - reads_before
            # Nobody waits any more: the baseline again, warm this time.
            after = run_http(server, "after", ordinary, warmup=50)
        finally:
            server.stop()

    wrong = [i for i in crowd if answered.get(i, (0, 0, ""))[1:] != (200, "rejected")]
    latencies = [answered[i][0] - decided[i] for i in crowd if i not in wrong]
    print(f"\n{'arm':8} {'reads':>6} {'rate/s':>8} {'p50 ms':>7} {'p95 ms':>7}")
    for m in (alone, with_crowd, after):
        print(
            f"{m.name:8} {m.requests:6d} {m.rate:8.0f} {m.pct(50) * 1e3:7.1f} "
            f"{m.pct(95) * 1e3:7.1f}"
        )
    # The baseline: the mean of the arms before and after the crowd (the first is colder).
    base_rate = (alone.rate + after.rate) / 2
    base_p50 = (alone.pct(50) + after.pct(50)) / 2
    base_p95 = (alone.pct(95) + after.pct(95)) / 2
    rate, p50, p95 = (
        with_crowd.rate / base_rate,
        with_crowd.pct(50) / base_p50,
        with_crowd.pct(95) / base_p95,
    )
    print(f"\nratio crowd/alone: rate {rate:.2f}, p50 {p50:.2f}, p95 {p95:.2f}")
    if latencies:
        print(
            f"wake after the decision's commit: p50 {pct(latencies, 50) * 1e3:.0f} ms, "
            f"p95 {pct(latencies, 95) * 1e3:.0f} ms, max {max(latencies) * 1e3:.0f} ms "
            f"({sum(1 for x in latencies if x > 1.0)} over 1 s)"
        )
    print(
        f"server reads for the waiters: {waker_reads:.0f} ({waker_reads / waiters:.2f} per "
        f"waiter); worker threads while {waiters} waited: {threads}"
    )
    if wrong:
        print(f"{len(wrong)} waiters got a wrong answer or none", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
