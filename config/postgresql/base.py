"""Django's PostgreSQL backend, with timestamps read by Python's C parser.

Under psycopg 3, Django reads every ``timestamptz`` with a loader of its own that derives
from psycopg's pure-Python one (Django ticket #36960, psycopg issue #1273): psycopg's C
loader cannot be subclassed, and Django will not reach it through psycopg's private API.
Reading a timestamp then costs microseconds of regular expressions, and a page that reads
hundreds of rows spends most of its row loading there: measured with ``bench/``, reading
500 audit events' two timestamps took 10.7 ms with Django's loader and 5.5 ms with this one.

PostgreSQL sends a ``timestamptz`` as ISO 8601 text in the ``ISO`` DateStyle (Django's
and the server's default); ``datetime.fromisoformat`` (C since Python 3.11) parses exactly
that. Anything else it refuses (another DateStyle, ``infinity``, a year before 1 or after
9999) goes to Django's loader as before, so the values and the errors are Django's. The
time zone is then set as Django's loader sets it.

One exception to Django's errors: a time PostgreSQL holds and Python cannot (before year 1
or after 9999 in UTC). Django's loader raises ``DataError`` for it, so a single such row
made every read that touched it fail for good (audit events are append-only). It loads as
``UnrepresentableTime``: the nearest time Python holds, a day inside the range so that a
conversion to any time zone still works, carrying PostgreSQL's own text of what is stored
(``stored``), which the audit chain hashes and the export writes. The console refuses such
times at its doors (``approvals.api``, ``SOURCE_TIME_EARLIEST``); this reads older rows.

``config/settings.py`` names this backend for a ``postgres://`` ``DATABASE_URL``.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db.backends.postgresql import base
from django.db.backends.postgresql.psycopg_any import BaseTzLoader, get_adapters_template
from psycopg import DataError, adapt

from config.postgresql import health


class UnrepresentableTime(datetime):
    """A stored time outside Python's years 1-9999 (in UTC): the nearest time Python holds,
    with PostgreSQL's text of the stored value in ``stored``."""

    stored: str

    @classmethod
    def of(cls, text: str) -> UnrepresentableTime | None:
        """The stand-in for PostgreSQL's ``timestamptz`` text, or None if it is in range."""
        if text.endswith(" BC"):
            moment = cls(1, 1, 2, tzinfo=UTC)
        elif text[:5].isdigit():  # five digits of year: after 9999
            moment = cls(9999, 12, 30, tzinfo=UTC)
        else:
            return None
        moment.stored = text
        return moment


class IsoTzLoader(BaseTzLoader):
    """Django's ``timestamptz`` loader with ``datetime.fromisoformat`` first."""

    def load(self, data: Any) -> datetime:
        try:
            value = datetime.fromisoformat(bytes(data).decode())
        except ValueError:
            try:
                return super().load(data)  # type: ignore[no-any-return]
            except DataError:
                unrepresentable = UnrepresentableTime.of(bytes(data).decode())
                if unrepresentable is None:
                    raise
                return unrepresentable
        # In UTC (Django's connection time zone here), the parser's zone is already the
        # very ``timezone.utc`` Django would set, and ``replace`` cost six times the parse.
        if value.tzinfo is self.timezone:
            return value
        return value.replace(tzinfo=self.timezone)


@lru_cache
def adapters_template(use_tz: bool, timezone: tzinfo | None) -> adapt.AdaptersMap:
    """Django's adapters for new connections, with ``IsoTzLoader`` for timestamps."""
    adapters = adapt.AdaptersMap(get_adapters_template(use_tz, timezone))
    # Django compares a cursor's time zone with the loader's ``timezone`` attribute and
    # registers its own loader on a cursor whose zone differs (a changed TIME_ZONE).
    loader = type("IsoTzLoaderInZone", (IsoTzLoader,), {"timezone": timezone})
    adapters.register_loader("timestamptz", loader)
    return adapters


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        if "context" in params:  # psycopg 3; the pool's connections are made from these too
            params["context"] = adapters_template(settings.USE_TZ, self.timezone)
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        # From the pool (under ASGI), checked by its socket (config/postgresql/health.py)
        # rather than by psycopg_pool's round trip, which settings.py turns off there. A
        # connection that fails goes back to the pool, which drops it and makes another;
        # after a restart every pooled connection may be dead, hence the bound.
        connection = super().get_new_connection(conn_params)
        pool = self.pool  # type: ignore[attr-defined]  # Django 5.1+, not in django-stubs yet
        if pool is None:
            return connection
        for _ in range(pool.max_size + 1):
            if health.healthy(connection):
                return connection
            pool.putconn(connection)
            connection = super().get_new_connection(conn_params)
        return connection

    def is_usable(self) -> bool:
        # A kept connection (CONN_MAX_AGE), checked before each request's first query.
        if self.connection is not None and health.looks_alive(self.connection):
            return True
        return bool(super().is_usable())
