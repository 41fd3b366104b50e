"""Money in arguments: integer minor units (``*_minor``) beside an ISO 4217 currency code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import iso4217

from approvals.canonical.parsing import child_path

MINOR_SUFFIX = "_minor"


def _accepted_currencies() -> dict[str, int]:
    """ISO 4217 (the maintenance agency's list one, as the ``iso4217`` package ships it):
    every current currency with its minor-unit exponent. Codes without minor units (XXX no
    currency, XTS testing, XAU and the other precious metals, XDR, XSU, XUA, the XB* bond
    units) and the funds codes (BOV, CHE, CHW, CLF, COU, MXV, USN, UYI) are not money a
    payment is made in, so they are left out."""
    funds = {
        (entry.findtext("Ccy") or "").strip()
        for entry in iso4217.raw_xml.iter("CcyNtry")
        if (name := entry.find("CcyNm")) is not None and name.get("IsFund") == "true"
    }
    return {
        currency.value: currency.exponent
        for currency in iso4217.Currency
        if currency.exponent is not None and currency.value not in funds
    }


CURRENCIES: dict[str, int] = _accepted_currencies()


def currency_exponent(code: Any) -> int | None:
    """Digits after the decimal point in the ISO 4217 currency ``code`` (2 for EUR, 0 for
    JPY, 3 for KWD), or None when ``code`` is no currency money is paid in."""
    return CURRENCIES.get(code) if isinstance(code, str) else None


def is_amount(key: str, value: Any) -> bool:
    """An integer amount in minor units: a ``*_minor`` key holding an integer."""
    return (
        key.endswith(MINOR_SUFFIX)
        and len(key) > len(MINOR_SUFFIX)
        and isinstance(value, int)
        and not isinstance(value, bool)
    )


def money_currencies(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """The ``currency`` of every object holding an integer ``*_minor`` amount, with its
    path (``currency``, ``lines[0].currency``): money is minor units plus a currency."""
    if isinstance(value, dict):
        if "currency" in value and any(is_amount(k, v) for k, v in value.items()):
            yield child_path(path, "currency"), value["currency"]
        for key, nested in value.items():
            if isinstance(nested, dict | list):
                yield from money_currencies(nested, child_path(path, key))
    elif isinstance(value, list):
        for index, nested in enumerate(value):
            yield from money_currencies(nested, f"{path}[{index}]")
