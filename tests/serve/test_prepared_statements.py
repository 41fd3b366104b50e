"""The console's statements are prepared on PostgreSQL once they repeat (``DATABASES``'
``server_side_binding`` and ``prepare_threshold``, config/settings.py): a page's queries
then skip PostgreSQL's parsing and, mostly, its planning. Checked on the server itself
(``pg_prepared_statements`` of this connection), with a page's own query; and the switch
for poolers that cannot keep them, ``DB_PREPARED_STATEMENTS=0``, turns them off."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from approvals.models import Occurrence
from approvals.web.selectors.review import review_get
from tests.test_settings_hardening import STRONG_KEY, run_python

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's statements"),
]

PRINT_OPTIONS = (
    "import json, config.settings as s; "
    "print(json.dumps(s.DATABASES['default'].get('OPTIONS', {})))"
)


def _options(**variables: str) -> dict[str, object]:
    result = run_python(
        PRINT_OPTIONS,
        SECRET_KEY=STRONG_KEY,
        DATABASE_URL="postgres://console@db.example.com/console",
        **variables,
    )
    assert result.returncode == 0, result.stderr
    options: dict[str, object] = json.loads(result.stdout)
    return options


def test_statements_are_bound_on_the_server_and_prepared_after_five_uses() -> None:
    assert _options() == {"server_side_binding": True, "prepare_threshold": 5}
    assert _options(DB_PREPARE_THRESHOLD="1")["prepare_threshold"] == 1


def test_the_switch_turns_them_off_for_poolers_that_cannot_keep_them() -> None:
    assert _options(DB_PREPARED_STATEMENTS="0") == {}


def _prepared_on_this_connection() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_review_page_query_is_prepared_on_the_server(approved: str) -> None:
    """The review page's own statement, asked for as often as the threshold, is then a
    prepared statement of this connection, with its values as parameters ($1 ...), not
    written into the text."""
    occurrence = Occurrence.objects.get(pk=approved)
    connection.ensure_connection()
    threshold = connection.connection.prepare_threshold
    assert threshold == 5
    for _ in range(threshold + 1):
        found = review_get(occurrence_id=occurrence.pk, tenant_ids=[occurrence.tenant_id])
        assert found is not None and found.occurrence.pk == occurrence.pk
    statements = [s for s in _prepared_on_this_connection() if "history_total" in s]
    assert len(statements) == 1, _prepared_on_this_connection()
    assert "$1" in statements[0] and occurrence.pk.hex not in statements[0].replace("-", "")


def test_pages_read_the_same_through_prepared_statements(approved: str, reviewer: Any) -> None:
    """A page requested past the threshold answers as it did the first time."""
    client = Client()
    client.force_login(reviewer)
    url = f"/reviews/{approved}/"
    first = client.get(url)
    assert first.status_code == 200
    for _ in range(6):
        again = client.get(url)
        assert again.status_code == 200
    run_id = Occurrence.objects.get(pk=approved).run_id
    assert run_id in first.content.decode() and run_id in again.content.decode()
    assert any("$1" in s for s in _prepared_on_this_connection())
