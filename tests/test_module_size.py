"""No module of the console grows past the house limit (about 600 lines, migrations aside):
a module that no longer fits in a reader's head is split by capability (docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("approvals", "reconciliation", "gateway", "demo", "config")
LIMIT = 600


def test_no_module_is_over_the_house_limit() -> None:
    too_long = {
        str(path.relative_to(ROOT)): lines
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
        and (lines := len(path.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert too_long == {}, f"split these by capability (docs/architecture.md): {too_long}"


def test_the_check_reads_every_package() -> None:
    """A renamed package would leave the check reading nothing."""
    for package in PACKAGES:
        assert any((ROOT / package).rglob("*.py")), package
