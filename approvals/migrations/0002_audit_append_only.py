"""Audit events are append-only: on PostgreSQL a trigger refuses UPDATE and DELETE."""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION approvals_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER approvals_auditevent_append_only
    BEFORE UPDATE OR DELETE ON approvals_auditevent
    FOR EACH ROW EXECUTE FUNCTION approvals_auditevent_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS approvals_auditevent_append_only ON approvals_auditevent;
DROP FUNCTION IF EXISTS approvals_auditevent_append_only();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD, params=None)


class Migration(migrations.Migration):
    dependencies = [("approvals", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
