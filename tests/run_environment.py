"""A pytest plugin: the environment a test run needs before the settings load.

- A throwaway ``SECRET_KEY`` for a run that was given none. The tests run with ``DEBUG``
  off, where ``config.settings`` refuses to load without a key of the deployment's own.
- ``CONSOLE_DEMO=1``: the demo app (the sandbox payments service, ``seed_demo``,
  ``simulate_agent``) is installed, as ``bin/demo`` installs it; a production console,
  with ``DEBUG`` off, has none of it.

pytest-django loads the settings before pytest imports any ``conftest.py``, so this has to
be a plugin named with ``-p`` (pyproject's ``addopts``), whose hook runs first. ``bin/test``
exports a key itself; subprocesses the tests start (``manage.py``, workers, the benchmarks)
inherit the same environment.
"""

from __future__ import annotations

import os
import secrets

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests() -> None:
    if not os.environ.get("SECRET_KEY", "").strip():
        os.environ["SECRET_KEY"] = secrets.token_urlsafe(50)
    os.environ.setdefault("CONSOLE_DEMO", "1")
