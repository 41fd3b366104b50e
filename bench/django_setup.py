"""What a benchmark does before it imports the console's models, in one place:

    ROOT = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(ROOT))
    from bench.django_setup import setup_django

    setup_django(debug_off=True)

The console's settings, and a throwaway ``SECRET_KEY`` when none is set: with DEBUG off the
settings refuse to load without a key of their own, and a benchmark (and any server it
starts, which inherits the environment) signs nothing worth keeping. ``debug_off`` forces
DEBUG off whatever the environment says, for benchmarks whose many queries must not pile
up in ``connection.queries``.
"""

from __future__ import annotations

import os
import secrets

import django


def setup_django(*, debug_off: bool = False) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if debug_off:
        os.environ["DEBUG"] = "0"
    if not os.environ.get("SECRET_KEY", "").strip():
        os.environ["SECRET_KEY"] = secrets.token_urlsafe(50)
    django.setup()
