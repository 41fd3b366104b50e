"""The README and docs/ are the map: every relative link in them leads somewhere, to a file
that exists and, with a #fragment, to a heading that file has (as GitHub names it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        ROOT / "bench" / "README.md",
        ROOT / "clients" / "python" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(path: Path) -> set[str]:
    """GitHub's ids for the file's headings: lowercased, punctuation dropped but hyphens
    and underscores, spaces as hyphens; a repeated heading gets -1, -2..."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"`([^`]*)`", r"\1", heading.group(1))
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for target in links(document):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        name, _, fragment = target.partition("#")
        destination = (document.parent / name).resolve() if name else document
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_the_anchor_rules_follow_github(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# The `bin/test` loop\n## Keys, rotation & fallbacks\n```\n# not a heading\n```\n"
        "## Keys, rotation & fallbacks\n"
    )
    assert anchors(page) == {
        "the-bintest-loop",
        "keys-rotation--fallbacks",
        "keys-rotation--fallbacks-1",
    }
