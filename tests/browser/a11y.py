"""What the accessibility tests check on a page: axe-core's violations, the page's live
regions, what its one live region says, where focus is, and whether it scrolls sideways.

axe-core comes from the npm registry, pinned in tests/browser/package-lock.json and
installed by ``npm ci`` (bin/test does it); it is injected into the page under test with
``page.add_script_tag`` (in a context that bypasses the CSP for that one script).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

AXE_JS = Path(__file__).resolve().parent / "node_modules" / "axe-core" / "axe.min.js"

# Everything the accessibility tree treats as a live region (implicit ones included).
LIVE_REGIONS = (
    "[aria-live]:not([aria-live=off]), [role=status], [role=alert], [role=log], "
    "[role=marquee], [role=timer], output"
)

_AXE_RUN = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.map((v) => ({
    id: v.id,
    impact: v.impact,
    help: v.help,
    nodes: v.nodes.map((n) => ({target: n.target.join(" "), summary: n.failureSummary})),
  }));
}"""


def axe_violations(page: Page) -> list[str]:
    """axe-core's violations on the page as it is now, one readable line per element."""
    if not AXE_JS.is_file():
        pytest.fail(
            f"axe-core is missing ({AXE_JS}): run `npm ci` in tests/browser (bin/test does)."
        )
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE_JS))
    violations: list[dict[str, Any]] = page.evaluate(_AXE_RUN)
    lines = []
    for violation in violations:
        for node in violation["nodes"]:
            summary = " ".join(str(node["summary"] or "").split())
            lines.append(
                f"{violation['id']} ({violation['impact']}): {violation['help']}"
                f" at {node['target']}: {summary}"
            )
    return lines


class AxeReport:
    """Collects violations over a walk through pages and states, then fails once, listing
    every page with its violations."""

    def __init__(self) -> None:
        self.found: dict[str, list[str]] = {}
        self.checked: list[str] = []

    def check(self, page: Page, name: str) -> None:
        self.checked.append(name)
        violations = axe_violations(page)
        if violations:
            self.found[name] = violations

    def assert_clean(self) -> None:
        if self.found:
            lines = [f"axe-core found violations on {len(self.found)} page(s):"]
            for name, violations in self.found.items():
                lines.append(f"  {name}:")
                lines.extend(f"    - {v}" for v in violations)
            pytest.fail("\n".join(lines), pytrace=False)


def live_regions(page: Page) -> list[str]:
    """Each live region on the page, as ``#id[role/aria-live]``."""
    described: list[str] = page.evaluate(
        """(selector) => Array.from(document.querySelectorAll(selector)).map((el) =>
             `${el.tagName.toLowerCase()}#${el.id}[role=${el.getAttribute("role")},` +
             `aria-live=${el.getAttribute("aria-live")}]`)""",
        LIVE_REGIONS,
    )
    return described


def assert_one_polite_live_region(page: Page) -> None:
    assert live_regions(page) == ["div#live-announcer[role=status,aria-live=polite]"], page.url


def record_announcements(page: Page) -> None:
    """From now on, every text the live region takes is kept in window.__announced."""
    page.evaluate(
        """() => {
          window.__announced = [];
          const region = document.getElementById("live-announcer");
          new MutationObserver(() => {
            const text = region.textContent.trim();
            if (text) window.__announced.push(text);
          }).observe(region, {childList: true, characterData: true, subtree: true});
        }"""
    )


def announced(page: Page) -> list[str]:
    said: list[str] = page.evaluate("window.__announced")
    return said


def active_element(page: Page) -> str:
    """The focused element as ``tag#id`` (``body#`` when focus was lost)."""
    described: str = page.evaluate(
        "() => `${document.activeElement.tagName.toLowerCase()}#${document.activeElement.id}`"
    )
    return described


def sideways_overflow(page: Page) -> int:
    """How many px the page scrolls sideways (0 when it fits its viewport)."""
    overflow: int = page.evaluate(
        "() => document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth"
    )
    return overflow
