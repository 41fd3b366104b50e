"""CPU instructions per request of the console's pages, counted by valgrind's callgrind.

A shared machine's speed changes by several times between hours, and every timing with
it; the instructions a request executes do not. For each page this runs a process that
requests it twice and one that requests it twelve times, both under
``valgrind --tool=callgrind``, and prints (twelve - two) / ten: one request, without the
process's start-up. Same database, same code, any hour: compare two commits with it.

    export DATABASE_URL=postgres://postgres@127.0.0.1:5432/console
    .venv/bin/python bench/page_bench.py --keep         # seed the database once
    .venv/bin/python bench/page_instructions.py
    .venv/bin/python bench/page_instructions.py --pages baseline,consumed --jobs 2

It reads the database ``page_bench.py --keep`` leaves ("<name>_page_bench"), and needs
valgrind (Debian's ``valgrind``). Python's hash seed is fixed so that runs compare.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FEW, MANY = 2, 12
# label: (how the child finds the path, requested as the bench's operator)
PAGES = {
    "baseline": "trivial template through the same middleware",
    "inbox": "/reviews/",
    "consumed": "review page of the newest consumed request",
    "long": "review page of the 5,000-event history",
    "queue": "/operations/",
    "timeline": "operator's timeline of the 5,000-event history",
    "investigation": "/investigations/?q=exec-replay-7",
}
_COLLECTED = re.compile(r"Collected : (\d+)")


def collected(stderr: str) -> int:
    """The instruction count callgrind prints when its process ends."""
    found = _COLLECTED.findall(stderr)
    if not found:
        raise RuntimeError(f"callgrind printed no count:\n{stderr[-2000:]}")
    return int(found[-1])


def child(label: str, requests: int, db_name: str) -> int:
    """Request one page ``requests`` times after three untimed requests; 1 if it failed."""
    sys.path.insert(0, str(ROOT))
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    import bench.page_bench as pb
    from approvals.models import Occurrence

    pb.install_urlconf()
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    connection.settings_dict["NAME"] = db_name
    connection.close()
    reviewer = get_user_model().objects.get(username=pb.REVIEWER)
    consumed = (
        Occurrence.objects.filter(status=Occurrence.Status.CLAIMED)
        .order_by("-created_at")
        .values_list("pk", flat=True)[0]
    )
    paths = {
        "baseline": (pb.BASELINE_PATH, False),
        "inbox": ("/reviews/", False),
        "consumed": (f"/reviews/{consumed}/", False),
        "long": (f"/reviews/{pb.HOT_OCCURRENCE_ID}/", False),
        "queue": ("/operations/", True),
        "timeline": (f"/operations/occurrences/{pb.HOT_OCCURRENCE_ID}/", True),
        "investigation": ("/investigations/?q=exec-replay-7", True),
    }
    path, as_operator = paths[label]
    client = Client()
    client.force_login(pb.operator_of(reviewer) if as_operator else reviewer)
    for _ in range(3):
        response = client.get(path)
        if response.status_code != 200:
            print(f"{label}: GET {path} answered {response.status_code}", file=sys.stderr)
            return 1
    pb.freeze_startup_heap()
    for _ in range(requests):
        client.get(path)
    return 0


def count(label: str, requests: int, db_name: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={tmp}/callgrind.out",
            sys.executable,
            __file__,
            "--child",
            label,
            "--requests",
            str(requests),
            "--db-name",
            db_name,
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0", "CONN_MAX_AGE": "1000000"}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{label}: the child failed:\n{result.stderr[-2000:]}")
    return collected(result.stderr)


def per_request(label: str, db_name: str) -> float:
    return (count(label, MANY, db_name) - count(label, FEW, db_name)) / (MANY - FEW)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pages", default=",".join(PAGES), help="comma-separated labels")
    parser.add_argument("--db-name", help="default: <DATABASE_URL name>_page_bench")
    parser.add_argument("--jobs", type=int, default=1, help="pages counted at once")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=FEW, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from bench.django_setup import setup_django

    setup_django()
    from django.db import connection

    db_name = args.db_name or f"{connection.settings_dict['NAME']}_page_bench"
    if args.child:
        return child(args.child, args.requests, db_name)

    labels = [label.strip() for label in args.pages.split(",") if label.strip()]
    unknown = [label for label in labels if label not in PAGES]
    if unknown or args.jobs < 1:
        parser.error(f"unknown pages {unknown} (known: {', '.join(PAGES)}); --jobs >= 1")
    if "baseline" not in labels:
        labels.insert(0, "baseline")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        counts = dict(
            zip(labels, pool.map(lambda label: per_request(label, db_name), labels), strict=True)
        )
    baseline = counts["baseline"]
    print(f"page_instructions: database {db_name}; ({MANY} requests - {FEW}) / {MANY - FEW}")
    print(f"{'page':<16} {'instructions':>14} {'/ baseline':>11}  what")
    for label, value in counts.items():
        print(f"{label:<16} {value / 1e6:>13.1f}M {value / baseline:>10.1f}x  {PAGES[label]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
