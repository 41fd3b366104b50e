"""Every console page keeps to the Content-Security-Policy by construction: no inline
script, no style attribute, no inline event handler. Also holds the small HTML reader the
other view tests use to look at what a page shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client

from approvals.models import Membership, Tenant
from tests.conftest import Runtime, approve, make_user

VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str | None]
    text: str = ""


@dataclass
class Tag:
    tag: str
    attrs: dict[str, str | None]


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[Tag] = []
        self.by_id: dict[str, Element] = {}
        self._open: list[tuple[str, list[Element]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append(Tag(tag, attributes))
        element = None
        if attributes.get("id"):
            element = Element(tag, attributes)
            self.by_id.setdefault(str(attributes["id"]), element)
        if tag not in VOID:
            self._open.append((tag, [element] if element else []))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(Tag(tag, dict(attrs)))
        if dict(attrs).get("id"):
            self.by_id.setdefault(str(dict(attrs)["id"]), Element(tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index][0] == tag:
                del self._open[index:]
                return

    def handle_data(self, data: str) -> None:
        for _, group in self._open:
            for element in group:
                element.text += data


@dataclass
class Html:
    """A parsed page: its tags, and elements by id with their text content."""

    source: str
    tags: list[Tag] = field(default_factory=list)
    by_id: dict[str, Element] = field(default_factory=dict)

    def text(self, element_id: str) -> str:
        return self.by_id[element_id].text

    def attr(self, element_id: str, name: str) -> str | None:
        return self.by_id[element_id].attrs.get(name)

    def has(self, element_id: str) -> bool:
        return element_id in self.by_id

    def find_all(self, tag: str, **attrs: str) -> list[Tag]:
        return [
            t
            for t in self.tags
            if t.tag == tag and all(t.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


def parse(response_or_text: Any) -> Html:
    text = (
        response_or_text
        if isinstance(response_or_text, str)
        else response_or_text.content.decode("utf-8")
    )
    reader = _Reader()
    reader.feed(text)
    reader.close()
    return Html(source=text, tags=reader.tags, by_id=reader.by_id)


def signed_in(user: Any, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def propose(runtime: Runtime, tool: str = "issue_refund", **fields: Any) -> str:
    response = runtime.propose(tool, **fields)
    assert response.status_code == 201, response.content
    occurrence_id: str = response.json()["occurrence_id"]
    return occurrence_id


# --- the policy holds on every page ----------------------------------------------------


def inline_code(page: Html) -> list[str]:
    """Everything the Content-Security-Policy would block on this page."""
    problems = []
    for tag in page.tags:
        if tag.tag == "script" and not tag.attrs.get("src"):
            problems.append("inline <script>")
        if tag.tag == "style":
            problems.append("<style> element")
        for name in tag.attrs:
            if name == "style":
                problems.append(f"style attribute on <{tag.tag}>")
            if name.startswith("on"):
                problems.append(f"{name} handler on <{tag.tag}>")
        for name in ("href", "action", "src", "hx-get", "hx-post"):
            value = tag.attrs.get(name) or ""
            if value.strip().lower().startswith("javascript:"):
                problems.append(f"javascript: URL in {name}")
    return problems


@pytest.fixture
def pages(runtime: Runtime, reviewer: Any, tenant: Tenant) -> list[str]:
    pending = propose(runtime)
    issued = propose(
        runtime, arguments={"payment_id": "p", "amount_minor": 1, "currency": "EUR", "reason": "r"}
    )
    approve(issued, reviewer)
    return ["/reviews/", "/reviews/?state=all", f"/reviews/{pending}/", f"/reviews/{issued}/"]


def test_console_pages_have_no_inline_code(pages: list[str], reviewer: Any, tenant: Tenant) -> None:
    admin = make_user("adele", tenant, Membership.Role.ADMIN, Membership.Role.REVIEWER)
    for user in (reviewer, admin):
        client = signed_in(user)
        for url in pages:
            response = client.get(url)
            assert response.status_code == 200, url
            assert inline_code(parse(response)) == [], url


def test_sign_in_page_has_no_inline_code(db: Any) -> None:
    response = Client().get("/accounts/login/")
    assert response.status_code == 200
    assert inline_code(parse(response)) == []


def test_htmx_is_served_locally_with_a_strict_config(reviewer: Any) -> None:
    page = parse(signed_in(reviewer).get("/reviews/"))
    sources = [t.attrs["src"] for t in page.tags if t.tag == "script"]
    assert sources and all(str(src).startswith("/static/") for src in sources)
    assert any("htmx" in str(src) for src in sources)
    config = next(t for t in page.find_all("meta") if t.attrs.get("name") == "htmx-config")
    content = str(config.attrs["content"])
    for setting in (
        '"allowEval":false',
        '"allowScriptTags":false',
        '"includeIndicatorStyles":false',
    ):
        assert setting in content
