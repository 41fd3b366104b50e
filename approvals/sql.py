"""Reading with plain SQL on PostgreSQL: the helpers the pages' hot reads are written with.

Building a queryset's statement costs Django more than PostgreSQL spends running it (the
review page's occurrence, with its dozen subqueries, took 1.5 ms to compile and 0.2 ms to
run: ``bench/page_instructions.py`` counts it). So the reads every page makes on every
request are written here as SQL, run on a cursor, and their rows turned into model
instances with ``Model.from_db``, as the ORM turns its rows into them (each field's
``from_db_value`` applied). Related rows a read joins are built the same way and set with
the public relation assignment (``occurrence.tool = tool``); lists of related rows are
returned as lists, never slipped into a manager's cache.

The reads themselves live in the selectors of the page that makes them (``approvals.web.
selectors``, ``reconciliation.selectors``, ``reconciliation.investigations.reads``), each
beside its ORM twin: the queryset it replaces, which SQLite (the demo) runs instead, and
which ``tests/approvals/test_page_sql.py`` (and its reconciliation counterpart) holds it
equal to on PostgreSQL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)

# A value of the console's own vocabulary (a state, a kind) written into a statement's
# text: a partial index serves a prepared statement's generic plan only when the
# statement's text implies the index's condition, which a parameter never does.
_WORD = re.compile(r"^[a-z][a-z0-9_.]*$")


def words(values: Iterable[str]) -> str:
    """``values`` (the console's own words, never input) as a SQL list of literals."""
    checked = list(values)
    for value in checked:
        if not _WORD.match(value):
            raise ValueError(f"{value!r} is not one of the console's own words")
    return ", ".join(f"'{value}'" for value in checked)


def on_postgresql() -> bool:
    """Whether the pages read through this module (else through the ORM twins)."""
    return connection.vendor == "postgresql"


class Columns:
    """The concrete columns of ``model`` (all but those named in ``defer``), selected under
    a table ``alias``, and how to build an instance from them (a deferred field is read
    when it is first used, as the ORM's ``defer`` does)."""

    def __init__(self, model: type[Model], alias: str, defer: Sequence[str] = ()) -> None:
        fields = [
            f
            for f in model._meta.concrete_fields
            if f.primary_key or (f.name not in defer and f.attname not in defer)
        ]
        self.model = model
        self.fields: list[Field[Any, Any]] = fields
        self.attnames = [f.attname for f in fields]
        self.sql = ", ".join(f'{alias}."{f.column}"' for f in fields)
        # Fields whose stored value Python reads through ``from_db_value`` (JSON).
        self._convert = [(i, f) for i, f in enumerate(fields) if hasattr(f, "from_db_value")]

    def __len__(self) -> int:
        return len(self.fields)

    def load(self, values: Sequence[Any]) -> Any:
        """An instance from ``values``, in this object's column order."""
        if self._convert:
            values = list(values)
            for i, field in self._convert:
                values[i] = field.from_db_value(values[i], None, connection)  # type: ignore[attr-defined]
        return self.model.from_db(connection.alias, self.attnames, values)


def fetch(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The rows of one statement."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def split(row: Sequence[Any], *parts: Columns | int) -> list[Any]:
    """``row`` cut into an instance per ``Columns`` (None when its primary key is NULL: a
    LEFT JOIN that found nothing) and a plain value per ``int`` count of columns."""
    out: list[Any] = []
    at = 0
    for part in parts:
        if isinstance(part, Columns):
            values = row[at : at + len(part)]
            out.append(None if values[0] is None else part.load(values))
            at += len(part)
        else:
            out.extend(row[at : at + part])
            at += part
    return out
