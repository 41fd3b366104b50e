"""The console's PostgreSQL backend (``config/postgresql/base.py``) reads every timestamp
as Django's own loader would: the same instants, in the same time zone, the same errors;
only faster. Checked against Django's loader on the same server, for ordinary instants,
generated ones and what the fast path leaves to Django (another DateStyle, infinity)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.conf import settings
from django.db import DataError, connection, transaction
from django.db.backends.postgresql.psycopg_any import register_tzloader
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the backend is the PostgreSQL one"
    ),
    pytest.mark.django_db,
]

TIMESTAMPTZ_OID = 1184


def _loader() -> type:
    from psycopg.pq import Format

    connection.ensure_connection()
    return connection.connection.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)


def _read(sql: str, params: list[Any], *, djangos: bool) -> list[datetime]:
    """The values of ``sql`` as the console reads them, or as Django's loader would."""
    with connection.cursor() as cursor:
        if djangos:
            register_tzloader(connection.timezone, cursor.cursor)
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def test_a_postgres_url_gets_the_consoles_backend_and_its_loader() -> None:
    from config.postgresql.base import IsoTzLoader

    assert settings.DATABASES["default"]["ENGINE"] == "config.postgresql"
    loader = _loader()
    assert issubclass(loader, IsoTzLoader)
    # Django registers its own loader on a cursor when the zones differ; they agree here.
    assert loader.timezone == connection.timezone


INSTANTS = [
    datetime(2026, 12, 1, 9, 8, 7, 654321, tzinfo=UTC),
    datetime(2026, 12, 1, 9, 8, 7, tzinfo=UTC),  # no fraction: PostgreSQL sends none
    datetime(2026, 12, 1, 9, 8, 7, 100000, tzinfo=UTC),  # sent as ".1"
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))),
]


def test_instants_read_as_djangos_loader_reads_them() -> None:
    sql = "SELECT unnest(%s::timestamptz[])"
    ours = _read(sql, [INSTANTS], djangos=False)
    djangos = _read(sql, [INSTANTS], djangos=True)
    assert ours == djangos == INSTANTS
    assert [v.tzinfo for v in ours] == [v.tzinfo for v in djangos] == [UTC] * len(INSTANTS)


def test_a_model_field_reads_the_same_through_the_orm() -> None:
    from approvals.models import Tenant

    tenant = Tenant.objects.create(slug="clock", name="Clock")
    stored = Tenant.objects.filter(pk=tenant.pk).values_list("created_at", flat=True).get()
    assert stored == tenant.created_at and stored.tzinfo == UTC


@hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=-9, minutes=-30))]),
    )
)
def test_any_instant_reads_as_djangos_loader_reads_it(instant: datetime) -> None:
    sql = "SELECT %s::timestamptz"
    assert _read(sql, [instant], djangos=False) == _read(sql, [instant], djangos=True)
    assert _read(sql, [instant], djangos=False) == [instant]


def test_what_iso_parsing_refuses_goes_to_djangos_loader() -> None:
    # PostgreSQL's own spelling of time outside the calendar: Django refuses it, and so does
    # the console, with the same error.
    for djangos in (False, True):
        with pytest.raises(DataError, match="infinity"), transaction.atomic():
            _read("SELECT 'infinity'::timestamptz", [], djangos=djangos)


def test_another_datestyle_reads_or_fails_as_with_djangos_loader() -> None:
    instant = datetime(2026, 12, 1, 9, 8, 7, 654321, tzinfo=UTC)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL DateStyle = 'ISO, DMY'")  # the same ISO text
        assert _read("SELECT %s::timestamptz", [instant], djangos=False) == [instant]
    for djangos in (False, True):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL DateStyle = 'SQL, DMY'")  # 01/12/2026 ... UTC
            with pytest.raises(NotImplementedError, match="DateStyle 'SQL, DMY'"):
                _read("SELECT %s::timestamptz", [instant], djangos=djangos)
