"""A pytest plugin: a throwaway ``SECRET_KEY`` for a test run that was given none.

The tests run with ``DEBUG`` off, where ``config.settings`` refuses to load without a key
of the deployment's own. pytest-django loads the settings before pytest imports any
``conftest.py``, so this has to be a plugin named with ``-p`` (pyproject's ``addopts``),
whose hook runs first. ``bin/test`` exports a key itself; subprocesses the tests start
(``manage.py``, workers, the benchmarks) inherit the same one through the environment.
"""

from __future__ import annotations

import os
import secrets

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests() -> None:
    if not os.environ.get("SECRET_KEY", "").strip():
        os.environ["SECRET_KEY"] = secrets.token_urlsafe(50)
