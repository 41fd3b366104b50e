"""What the console refuses, as exceptions with a stable machine-readable code: ``InputError``
for bad input from outside (a 4xx naming the field), ``ServiceError`` for a refused state
change."""

from __future__ import annotations

from typing import Any


class InputError(Exception):
    """Bad input from outside, with a stable machine-readable code and the field it names."""

    def __init__(
        self,
        code: str,
        message: str,
        field: str | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.details = details or []


class ServiceError(Exception):
    """A refused state change: a stable code, a message for people, an HTTP status, and
    ``details``: the refusal's facts as fields (a rejection's ``reason``), for programs."""

    def __init__(
        self, code: str, message: str, status: int = 409, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.details = details
