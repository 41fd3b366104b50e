"""Hot reads compiled once per process: the ORM builds and compiles a statement the first
time it is asked for, and later requests only bind their values and run it.

Compiling a queryset costs Django more than PostgreSQL spends running it: the review page's
statement with its dozen subqueries took 1.5 ms to compile and 0.2 ms to run, and a page's
compiling came to a quarter of its time (``bench/page_bench.py``). A ``Compiled`` read
names its values with ``Param`` (one value) and ``ParamList`` (a list, compiled once per
length), so that the SQL text is the same for every request; each call binds the values,
as the field's ``get_db_prep_value`` prepares them for the connection, and runs the
statement through Django's own iteration (model instances, ``select_related``,
``prefetch_related``, ``values_list``, converters), exactly as the queryset would.

What a build function bakes into the statement is the same for every call: it must take
every value that varies as a ``Param`` (never ``timezone.now()``, a user, a tenant).
``tests/approvals/test_compiled.py`` holds each compiled read equal to its queryset.
"""

from __future__ import annotations

import copy
import inspect
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import BigIntegerField, CharField, Field, IntegerField, QuerySet
from django.db.models.expressions import Expression
from django.db.models.sql.compiler import SQLCompiler

T = TypeVar("T")


@dataclass(frozen=True)
class _Slot:
    """Where a value goes in the compiled parameters: ``name``, or item ``index`` of it."""

    name: str
    field: Field[Any, Any]
    index: int | None = None
    array: bool = False  # a whole list, in one parameter (ParamArray)


class Param(Expression):
    """One value, given when the compiled read runs."""

    def __init__(self, name: str, field: Field[Any, Any]) -> None:
        super().__init__(output_field=field)
        self.name = name

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return "%s", [_Slot(self.name, self.output_field)]


class ParamList(Expression):
    """A list of ``size`` values for ``__in``, given when the compiled read runs."""

    def __init__(self, name: str, size: int, field: Field[Any, Any]) -> None:
        if size < 1:
            raise ValueError("an empty list matches nothing: leave its condition out")
        super().__init__(output_field=field)
        self.name, self.size = name, size

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        slots = [_Slot(self.name, self.output_field, i) for i in range(self.size)]
        return ", ".join(["%s"] * self.size), list(slots)


class Literal(Expression):
    """A constant written into the statement's text, not sent as a parameter.

    A partial index serves a prepared statement's generic plan only if the statement's
    own text implies the index's condition: ``state IN ($1, $2)`` does not imply
    ``state IN ('issued', 'expired')``, so PostgreSQL planned such a statement anew on
    every run (``pg_prepared_statements.custom_plans``). For the console's own constants
    (states, kinds), never for input."""

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or "%" in value:
            raise ValueError("a literal is one of the console's own words, without %")
        super().__init__(output_field=CharField())
        self.value = value

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return "'" + self.value.replace("'", "''") + "'", []


def literals(values: Iterable[str]) -> list[Literal]:
    """``values`` as ``Literal``s, for ``__in``."""
    return [Literal(value) for value in values]


class ParamArray(Expression):
    """A list of values of ``field`` (integer ids by default), of any length, for
    ``__in``, given when the compiled read runs: one parameter, ``IN (SELECT
    unnest(%s::<type>[]))`` on PostgreSQL and a JSON list elsewhere (SQLite), so that a
    list of hundreds of ids costs neither a statement per length nor a parameter per id."""

    def __init__(self, name: str, field: Field[Any, Any] | None = None) -> None:
        super().__init__(output_field=field or BigIntegerField())
        self.name = name

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        slot = _Slot(self.name, self.output_field, array=True)
        if connection.vendor == "postgresql":
            return f"SELECT unnest(%s::{self.output_field.db_type(connection)}[])", [slot]
        return "SELECT value FROM json_each(%s)", [slot]


@dataclass(frozen=True)
class _Entry:
    queryset: QuerySet[Any]
    compiler: SQLCompiler | None  # None: the statement can match nothing (not run)
    sql: str
    params: tuple[Any, ...]
    # What turns each column's value into Python, as the compiler would work it out anew on
    # every run (``SQLCompiler.results_iter``).
    converters: dict[int, Any] | None = None

    def bind(self, values: dict[str, Any], connection: Any) -> tuple[Any, ...]:
        return _bind(self.params, values, connection)


def _bind(params: Iterable[Any], values: dict[str, Any], connection: Any) -> tuple[Any, ...]:
    """``params`` with each ``Param``'s value, prepared as its field prepares it."""
    bound = []
    for param in params:
        if isinstance(param, _Slot):
            value = values[param.name]
            if param.array:
                if isinstance(param.field, IntegerField):  # ids: no more than int()
                    items = [int(item) for item in value]
                    if connection.vendor == "postgresql":
                        # The array's text, which the statement casts: the driver's
                        # dumping of a list costs more, per id, than the read it is for.
                        bound.append("{" + ",".join(map(str, items)) + "}")
                        continue
                else:
                    items = [
                        param.field.get_db_prep_value(item, connection, prepared=False)
                        for item in value
                    ]
                param = items if connection.vendor == "postgresql" else json.dumps(items)
            else:
                if param.index is not None:
                    value = value[param.index]
                param = param.field.get_db_prep_value(value, connection, prepared=False)
        bound.append(param)
    return tuple(bound)


Shape = tuple[tuple[str, Any], ...]


def _sized(build: Callable[..., Any]) -> list[str]:
    """What ``build`` takes (without a default): the lists whose lengths make the
    statement, and the ``fixed`` values."""
    return [
        name
        for name, parameter in inspect.signature(build).parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        and parameter.default is parameter.empty
    ]


def _shape(sized: list[str], fixed: dict[str, Any], values: dict[str, Any]) -> Shape:
    return tuple((name, fixed[name] if name in fixed else len(values[name])) for name in sized)


class Compiled(Generic[T]):
    """A read whose statement ``build`` makes with ``Param``s; ``build`` is given the
    length of each list value (by name), and the statement is compiled once per connection
    alias and lengths.

        _REVIEW = Compiled(lambda tenant_ids: Occurrence.objects.filter(
            pk=Param("pk", UUIDField()),
            tenant_id__in=ParamList("tenant_ids", tenant_ids, BigIntegerField()),
        ))
        _REVIEW.run(pk=occurrence_id, tenant_ids=[1, 2])   # a list of Occurrence
    """

    # Statements kept per read, one per combination of list lengths: beyond this many the
    # oldest is dropped (and compiled again if it is asked for again).
    MAX_SHAPES = 64

    def __init__(self, build: Callable[..., QuerySet[Any]], *, using: str = "default") -> None:
        self._build = build
        self._using = using
        self._sized = _sized(build)
        self._entries: OrderedDict[Shape, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def run(self, fixed: dict[str, Any] | None = None, **values: Any) -> list[T]:
        """The rows for ``values``. ``fixed`` goes to ``build`` as it is and makes a
        statement of its own (a limit, say: what a parameter cannot be)."""
        shape = _shape(self._sized, fixed or {}, values)
        entry = self._entries.get(shape)
        if entry is None:
            entry = self._compile(shape)
        if entry.compiler is None:
            return []  # as Django answers a condition that can match nothing: no query
        connection = connections[self._using]
        params = entry.bind(values, connection)
        # A copy per run: the compiled one is shared by every thread.
        compiler = copy.copy(entry.compiler)
        compiler.connection = connection
        compiler.as_sql = lambda *args, **kwargs: (entry.sql, params)  # type: ignore[method-assign]
        compiler.get_converters = lambda expressions: entry.converters  # type: ignore[method-assign,assignment,return-value]
        queryset = entry.queryset._chain()  # type: ignore[attr-defined]
        queryset.query.get_compiler = lambda *args, **kwargs: compiler
        return list(queryset)

    def _compile(self, shape: Shape) -> _Entry:
        with self._lock:
            entry = self._entries.get(shape)
            if entry is None:
                queryset = self._build(**dict(shape))
                compiler = queryset.query.get_compiler(using=self._using)
                try:
                    sql, params = compiler.as_sql()
                except EmptyResultSet:
                    entry = _Entry(queryset, None, "", ())
                else:
                    columns = [column[0] for column in compiler.select[0 : compiler.col_count]]
                    converters = compiler.get_converters(columns)
                    entry = _Entry(queryset, compiler, sql, tuple(params), converters)
                self._entries[shape] = entry
                while len(self._entries) > self.MAX_SHAPES:
                    self._entries.popitem(last=False)
            return entry

    def compiled(self) -> Iterable[str]:
        """The statements compiled so far (for tests)."""
        return [entry.sql for entry in self._entries.values() if entry.compiler is not None]


def prefetched(instance: Any, name: str, rows: list[Any]) -> None:
    """Keep ``rows`` (read by a compiled read) as ``instance.<name>.all()``, as
    ``prefetch_related`` keeps what it reads: each row's link back to ``instance`` set, and
    the related manager answering from them without a query. ``name`` is a reverse
    foreign key's accessor (``occurrence.proposals``)."""
    manager = getattr(instance, name)
    field = manager.field
    for row in rows:
        field.set_cached_value(row, instance)
    queryset = manager.get_queryset()
    queryset._result_cache = rows
    queryset._prefetch_done = True
    if not hasattr(instance, "_prefetched_objects_cache"):
        instance._prefetched_objects_cache = {}
    instance._prefetched_objects_cache[field.remote_field.cache_name] = queryset


class CompiledStatement:
    """A statement put together from querysets' SQL (``build`` returns the SQL and its
    parameters, ``Param``s among them: see ``reconciliation.selectors.queue.queue_counts``), put
    together once per shape as ``Compiled`` does, and run on a cursor."""

    def __init__(
        self, build: Callable[..., tuple[str, Iterable[Any]]], *, using: str = "default"
    ) -> None:
        self._build = build
        self._using = using
        self._sized = _sized(build)
        self._statements: dict[Shape, tuple[str, tuple[Any, ...]]] = {}

    def rows(self, fixed: dict[str, Any] | None = None, **values: Any) -> list[tuple[Any, ...]]:
        shape = _shape(self._sized, fixed or {}, values)
        statement = self._statements.get(shape)
        if statement is None:
            sql, params = self._build(**dict(shape))
            statement = self._statements[shape] = (sql, tuple(params))
        connection = connections[self._using]
        sql, params = statement
        with connection.cursor() as cursor:
            cursor.execute(sql, _bind(params, values, connection))
            return list(cursor.fetchall())
