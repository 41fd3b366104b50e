"""The console as an ASGI application: what ``bin/serve`` runs (``config/gunicorn.conf.py``).

Django's ASGI handler, with ``approvals.api.longpoll.LongPollApp`` in front so that
``GET /api/v1/occurrences/{id}?wait=N`` waits on the event loop instead of in a thread.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Read by config/settings.py: no persistent connections, a pool per process instead.
os.environ["CONSOLE_SERVED_BY_ASGI"] = "1"
django_application = get_asgi_application()

from approvals.api.longpoll import LongPollApp  # noqa: E402  (after Django is set up)

application = LongPollApp(django_application)
