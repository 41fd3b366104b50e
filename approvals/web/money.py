"""Money as people read it: integer minor units with their ISO 4217 currency, written out."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.utils.safestring import SafeString

from approvals.canonical.money import currency_exponent, is_amount
from approvals.web.text import reveal_html

_MINOR_SUFFIX = "_minor"


_MAX_MONEY_LINES = 20


def minor_units(currency: str) -> int | None:
    """Digits after the decimal point in ``currency``, from ISO 4217 (the ``iso4217``
    package's copy of the maintenance agency's list), or None for a code that is no
    currency money is paid in (XXX, XTS, XAU, funds, anything unlisted)."""
    return currency_exponent(currency)


def format_money(amount_minor: int, currency: str) -> str:
    """``8000, "EUR"`` -> ``"EUR 80.00"``; ``12000, "JPY"`` -> ``"JPY 12,000"``.

    Integer arithmetic only: the amount is shown exactly, never rounded through a float.
    A code that is not an ISO 4217 currency is a ValueError: it is never shown as money.
    """
    digits = minor_units(currency)
    if digits is None:
        raise ValueError(f"{currency!r} is not an ISO 4217 currency.")
    sign = "-" if amount_minor < 0 else ""
    whole, fraction = divmod(abs(amount_minor), 10**digits)
    text = f"{whole:,}"
    if digits:
        text += f".{fraction:0{digits}d}"
    return f"{currency} {sign}{text}"


@dataclass(frozen=True)
class MoneyLine:
    """One amount read for a person: which argument it comes from and what it says."""

    label: SafeString  # "Amount"; keys come from the agent, so hidden characters are shown
    path: SafeString  # "amount_minor", or "lines[0].amount_minor" inside nested values
    amount_minor: int
    currency: str
    text: str  # "EUR 80.00"


_is_amount = is_amount


def _label(key: str) -> str:
    words = key.removesuffix(_MINOR_SUFFIX).replace("_", " ").strip()
    return words[:1].upper() + words[1:]


def _money_in(value: Any, path: str) -> Iterator[MoneyLine]:
    if isinstance(value, dict):
        currency = value.get("currency")
        if isinstance(currency, str) and minor_units(currency) is not None:
            for key, amount in value.items():
                if _is_amount(key, amount):
                    yield MoneyLine(
                        label=reveal_html(_label(key)),
                        path=reveal_html(f"{path}.{key}" if path else key),
                        amount_minor=amount,
                        currency=currency,
                        text=format_money(amount, currency),
                    )
        for key, nested in value.items():
            if isinstance(nested, dict | list):
                yield from _money_in(nested, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, nested in enumerate(value):
            yield from _money_in(nested, f"{path}[{index}]")


def money_lines(arguments: dict[str, Any]) -> list[MoneyLine]:
    """Every integer ``*_minor`` amount that has a ``currency`` code beside it.

    Only an ISO 4217 currency counts (not XXX, XTS, precious metals or funds); anything
    else is left as the JSON shows it rather than guessed at.
    """
    lines: list[MoneyLine] = []
    for line in _money_in(arguments, ""):
        lines.append(line)
        if len(lines) == _MAX_MONEY_LINES:
            break
    return lines
