"""Reading the evaluate stage's HTML pages back in tests: their tags, attributes and rows."""

from __future__ import annotations

import html.parser


class PageParser(html.parser.HTMLParser):
    """Collects every start tag with its attributes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {name: value or "" for name, value in attrs}))


def tags(page: str, name: str) -> list[dict[str, str]]:
    """The attributes of every `<name>` tag in the page."""
    parser = PageParser()
    parser.feed(page)
    parser.close()
    return [attrs for tag, attrs in parser.tags if tag == name]


def row_ids(page: str) -> list[str]:
    """The ids of the trend table's rows (`night-<date>`), in page order."""
    return [attrs["id"] for attrs in tags(page, "tr") if attrs.get("id", "").startswith("night-")]
