"""Keep Python's cyclic garbage collector off a served process's long-lived heap.

A page allocates tens of thousands of short-lived objects, so the collector runs many
times per request, and every few of its runs is a full one that walks every object the
process holds: Django's models, URLconf, compiled templates and every imported module,
hundreds of thousands of objects that will live as long as the process. ``gc.freeze()``
moves what exists at that moment into a generation the collector never walks. Measured
with ``bench/page_bench.py``: pages took about a quarter less time with the startup heap
frozen than without.

Then the collector is told to run less often: by default it collects the young generation
every 700 new container objects, dozens of times per page, and each survivor is walked
again by the middle generation's runs. ``GC_THRESHOLDS`` lets a request's short-lived
objects die by reference counting before the collector looks, as Instagram's and other
large Django deployments tune theirs. Measured with ``bench/page_bench.py`` at scale 1, the
same hour, the pages in turn: p50 10-20 % and p95 15-25 % lower than with the defaults,
about what switching the collector off gave; cycles are still collected, a few times a
second instead of hundreds.

``config/gunicorn.conf.py`` calls ``freeze_startup_heap`` in each worker once it has loaded
the application; the page bench calls it after its warm-up, as a worker would be then.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from django.conf import settings
from django.template import TemplateDoesNotExist, TemplateSyntaxError
from django.template.loader import get_template
from django.urls import get_resolver

# Young generation every 50,000 new container objects (a page or two), the middle one every
# 20 of those, the whole heap every 100 of those (and, as always, only once the survivors
# since the last full run are a quarter of the heap). Python's defaults: (700, 10, 10).
GC_THRESHOLDS = (50_000, 20, 100)


def _warm_templates() -> int:
    """Compile the project's templates into the cached loader now, not on first use."""
    compiled = 0
    engine: dict[str, Any] = settings.TEMPLATES[0]
    for directory in engine.get("DIRS", []):
        root = Path(directory)
        for path in sorted(root.rglob("*.html")):
            try:
                get_template(path.relative_to(root).as_posix())
            except (TemplateDoesNotExist, TemplateSyntaxError):
                continue
            compiled += 1
    return compiled


def freeze_startup_heap() -> int:
    """Import every view (through the URLconf), compile the templates, collect once,
    freeze what is left and collect less often from now on (``GC_THRESHOLDS``); returns
    how many objects are now frozen."""
    get_resolver().url_patterns  # noqa: B018 - importing the URLconf imports every view
    _warm_templates()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return gc.get_freeze_count()
