"""No file of the repository keeps a merge's conflict markers: a README once shipped with
``<<<<<<< HEAD`` in its middle, read by every newcomer and caught by no test."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
SUFFIXES = {".py", ".md", ".html", ".js", ".css", ".toml", ".txt", ".cfg", ".ini", ".sh", ""}
# Not =======: a Markdown heading may be underlined with exactly seven.
MARKER = re.compile(r"^(<{7}|>{7}) ", re.MULTILINE)


def text_files() -> list[Path]:
    return [
        path
        for path in ROOT.rglob("*")
        if path.is_file()
        and path.suffix in SUFFIXES
        and not SKIP.intersection(path.relative_to(ROOT).parts)
        and not any(part.startswith(".venv") for part in path.relative_to(ROOT).parts)
    ]


def test_no_file_keeps_conflict_markers() -> None:
    marked = [
        str(path.relative_to(ROOT))
        for path in text_files()
        if MARKER.search(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert marked == [], f"resolve the merge in: {marked}"


def test_the_check_reads_the_readme_and_the_code() -> None:
    """A wrong root or filter would make the check read nothing and pass."""
    read = {str(path.relative_to(ROOT)) for path in text_files()}
    assert {"README.md", "manage.py", "bin/test"} <= read
