"""Every change to what ``GET /api/v1/occurrences/{id}`` shows NOTIFYs the occurrence's id on
the channel ``occurrence_changed`` (PostgreSQL only), so a long-poll waiting on it
(``approvals.longpoll``) wakes as the deciding transaction commits, and never before: a
NOTIFY is delivered at COMMIT and dropped on ROLLBACK. The payload is the occurrence's id
and nothing else (no tenant, no token hash). An UPDATE that changes nothing notifies
nothing; a statement that touches several rows of one occurrence notifies once, as
PostgreSQL folds identical notifications of one transaction."""

from django.db import migrations

CHANNEL = "occurrence_changed"

# table -> the column that holds the occurrence's id
TABLES = {
    "approvals_occurrence": "id",
    "approvals_proposal": "occurrence_id",
    "approvals_approval": "occurrence_id",
    "approvals_command": "occurrence_id",
    "approvals_epoch": "occurrence_id",
}

FUNCTION = """
CREATE OR REPLACE FUNCTION approvals_notify_{column}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{channel}', NEW.{column}::text);
    RETURN NULL;
END
$$;
"""

TRIGGERS = """
CREATE TRIGGER {table}_notify_insert AFTER INSERT ON {table}
    FOR EACH ROW EXECUTE FUNCTION approvals_notify_{column}();
CREATE TRIGGER {table}_notify_update AFTER UPDATE ON {table}
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*)
    EXECUTE FUNCTION approvals_notify_{column}();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for column in sorted(set(TABLES.values())):
        schema_editor.execute(FUNCTION.format(channel=CHANNEL, column=column), params=None)
    for table, column in TABLES.items():
        schema_editor.execute(TRIGGERS.format(table=table, column=column), params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(
            f"DROP TRIGGER IF EXISTS {table}_notify_insert ON {table};"
            f"DROP TRIGGER IF EXISTS {table}_notify_update ON {table};",
            params=None,
        )
    for column in sorted(set(TABLES.values())):
        schema_editor.execute(f"DROP FUNCTION IF EXISTS approvals_notify_{column}();", params=None)


class Migration(migrations.Migration):
    dependencies = [("approvals", "0018_bound_execution_has_a_database_default")]
    operations = [migrations.RunPython(forward, backward)]
