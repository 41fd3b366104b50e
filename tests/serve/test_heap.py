"""config/heap.py: a served worker's startup heap is frozen out of the garbage collector's
full runs, with every view imported and every template compiled first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.serve.servers import ROOT

PROBE = """
import gc, json
import django
django.setup()
from django.template import engines
from config.heap import freeze_startup_heap
before = gc.get_freeze_count()
frozen = freeze_startup_heap()
loaders = list(engines["django"].engine.template_loaders)
while not hasattr(loaders[0], "get_template_cache"):  # template_partials wraps the cache
    loaders = list(loaders[0].loaders)
cache = loaders[0].get_template_cache
print(json.dumps({
    "before": before,
    "frozen": frozen,
    "count": gc.get_freeze_count(),
    "views": "approvals.web.review" in __import__("sys").modules,
    "templates": sorted(key.rsplit("-", 1)[-1] for key in cache),
}))
"""


def test_freeze_startup_heap_imports_the_views_compiles_templates_and_freezes() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before"] == 0
    assert report["frozen"] == report["count"] > 10_000
    assert report["views"]
    for name in ("base.html", "approvals/inbox.html", "approvals/review.html", "404.html"):
        assert name in report["templates"], report["templates"]
