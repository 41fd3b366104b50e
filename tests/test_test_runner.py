"""The test loop itself: ``bin/test --help`` answers before installing or starting anything,
``bin/_venv.sh`` keeps a venv per interpreter (so CI's run on a newer Python never touches
``.venv``), and a test that uses a process-starting fixture is marked slow (so that
``bin/test --fast`` leaves it out)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import SLOW_FIXTURES, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[1]
THIS_VERSION = "{}.{}".format(*sys.version_info[:2])


def _bash(script: str, *, env: dict[str, str], timeout: float = 30) -> Any:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_prints_the_usage_at_once_without_the_interpreter_it_would_install_with() -> None:
    # An interpreter that does not exist: anything past the usage would stop on it.
    for flag in ("--help", "-h"):
        result = _bash(f"bin/test {flag}", env={"PYTHON": "python-that-does-not-exist"})

        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("Usage: bin/test [--fast]")
        assert "--fast" in result.stdout and "SKIP_LINT" in result.stdout
        assert result.stderr == ""


def _venv_of(env: dict[str, str]) -> Any:
    return _bash('source bin/_venv.sh && echo "$PY" && echo "$VENV"', env=env)


def test_the_default_interpreter_keeps_dot_venv() -> None:
    result = _venv_of({})

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == str(ROOT / ".venv")


def test_another_interpreter_gets_a_venv_named_by_its_version() -> None:
    result = _venv_of({"PYTHON": sys.executable})

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [sys.executable, str(ROOT / f".venv-py{THIS_VERSION}")]


def test_an_interpreter_that_does_not_run_is_refused_by_name() -> None:
    result = _venv_of({"PYTHON": "python-that-does-not-exist"})

    assert result.returncode == 2
    assert "PYTHON=python-that-does-not-exist does not run here" in result.stderr


def test_a_pyenv_shim_of_a_version_not_selected_is_found_among_pyenvs_versions(
    tmp_path: Path,
) -> None:
    # What pyenv does for a version installed but not selected: its shim on PATH fails,
    # `pyenv whence` names the version, the interpreter sits under `pyenv root`.
    shims, root = tmp_path / "shims", tmp_path / "pyenv"
    shims.mkdir()
    installed = root / "versions" / "3.99.1" / "bin"
    installed.mkdir(parents=True)
    (installed / "python3.99").symlink_to(sys.executable)
    (shims / "python3.99").write_text(
        "#!/bin/sh\necho 'pyenv: python3.99: command not found' >&2\nexit 127\n"
    )
    (shims / "pyenv").write_text(
        "#!/bin/sh\n"
        f'case "$1" in root) echo "{root}" ;;\n'
        '  whence) [ "$2" = python3.99 ] && echo 3.99.1 ;;\n'
        "esac\n"
    )
    for script in shims.iterdir():
        script.chmod(0o755)

    result = _bash(
        'source bin/_venv.sh && echo "$PY" && echo "$VENV"',
        env={"PYTHON": "python3.99", "PATH": f"{shims}:{os.environ['PATH']}"},
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        str(installed / "python3.99"),
        str(ROOT / f".venv-py{THIS_VERSION}"),
    ]


def _item(*fixturenames: str) -> Any:
    markers: list[str] = []
    return SimpleNamespace(
        fixturenames=list(fixturenames),
        markers=markers,
        add_marker=lambda mark: markers.append(mark.name),
    )


@pytest.mark.parametrize("fixture", sorted(SLOW_FIXTURES))
def test_a_test_using_a_process_starting_fixture_is_marked_slow(fixture: str) -> None:
    item = _item("db", fixture, "tmp_path")

    pytest_collection_modifyitems([item])

    assert item.markers == ["slow"]


def test_a_test_using_none_of_them_is_left_as_it_is() -> None:
    item = _item("db", "runtime", "live_server", "sandbox", "tmp_path")

    pytest_collection_modifyitems([item])

    assert item.markers == []
