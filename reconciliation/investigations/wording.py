"""How investigations word what they count and list: short ids, "twice", "and 3 more"."""

from __future__ import annotations

from datetime import datetime


def short(value: str) -> str:
    """A UUID's first 8 characters, for sentences; tables show it whole."""
    return value[:8] if len(value) == 36 else value


def times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


def plural(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


LISTED = 5  # the items a verdict's fact names before "and N more"


TITLE_VALUES = 20  # the values a count's tooltip names


def listing(
    items: list[str], most: int = LISTED, *, total: int | None = None, separator: str = "; "
) -> str:
    """The first ``most`` items, and how many more of ``total`` (``len(items)``) there are:
    a caller with hundreds of items may pass only the first ``most``, formatted."""
    shown = items[:most]
    rest = (len(items) if total is None else total) - len(shown)
    return separator.join(shown) + (f"{separator}and {rest} more" if rest else "")


def when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "an unknown time"
