"""PostgreSQL triggers for the audit trail's chain and its export cursor.

1. ``approvals_auditevent_append_only`` (from 0002) keeps refusing every UPDATE and DELETE
   of an audit event, except the one UPDATE that sets the chain columns (``chain_seq``,
   ``hash``, ``prev_hash``) of an event whose chain columns are all still NULL and changes
   nothing else. The comparison covers the whole row, so a column added later is protected
   without touching this function.
2. Audit ingestions and duplicate deliveries are append-only too.
3. ``approvals_auditevent_register_writer`` (BEFORE INSERT, once per statement, so before
   the statement draws any id from the sequence): the first time a transaction inserts an
   audit event it takes a shared advisory lock whose key is 2^62 + the largest id drawn so
   far, and holds it until it commits or rolls back. Every id the transaction draws is
   above that key. A reader (``selectors.audit_watermark``) takes the sequence's last value
   and then the smallest such key of the other open transactions: every id up to the
   smaller of the two belongs to a transaction that has ended, so a cursor never passes an
   id that could still commit later. The lock is shared: writers never wait for each other.

SQLite has none of this: it allows one writer at a time, so ids commit in order.
"""

from django.db import migrations

# Advisory lock keys from 2^62 up are the audit writers' (see the docstring); the key's
# upper half, which pg_locks shows as classid, is then at least 2^30.
WRITER_KEY_BASE = 2**62

APPEND_ONLY_WITH_CHAIN = """
CREATE OR REPLACE FUNCTION approvals_auditevent_append_only() RETURNS trigger AS $$
DECLARE
    unchained approvals_auditevent;
BEGIN
    IF TG_OP = 'UPDATE'
       AND OLD.chain_seq IS NULL AND OLD.hash IS NULL AND OLD.prev_hash IS NULL
       AND NEW.chain_seq IS NOT NULL AND NEW.hash IS NOT NULL AND NEW.prev_hash IS NOT NULL
    THEN
        unchained := NEW;
        unchained.chain_seq := NULL;
        unchained.hash := NULL;
        unchained.prev_hash := NULL;
        IF unchained IS NOT DISTINCT FROM OLD THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'audit events are append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

APPEND_ONLY_ORIGINAL = """
CREATE OR REPLACE FUNCTION approvals_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

INGESTION_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION approvals_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER approvals_auditingestion_append_only
    BEFORE UPDATE OR DELETE ON approvals_auditingestion
    FOR EACH ROW EXECUTE FUNCTION approvals_append_only();

CREATE TRIGGER approvals_auditduplicatedelivery_append_only
    BEFORE UPDATE OR DELETE ON approvals_auditduplicatedelivery
    FOR EACH ROW EXECUTE FUNCTION approvals_append_only();
"""

REGISTER_WRITER = """
CREATE OR REPLACE FUNCTION approvals_auditevent_register_writer() RETURNS trigger AS $$
BEGIN
    IF current_setting('approvals.audit_writer', true) = 'registered' THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(
        {base} + coalesce(pg_sequence_last_value('{sequence}'::regclass), 0)
    );
    -- Transaction-local: gone at commit or rollback, and with a rolled-back savepoint.
    PERFORM set_config('approvals.audit_writer', 'registered', true);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER approvals_auditevent_register_writer
    BEFORE INSERT ON approvals_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION approvals_auditevent_register_writer();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS approvals_auditevent_register_writer ON approvals_auditevent;
DROP FUNCTION IF EXISTS approvals_auditevent_register_writer();
DROP TRIGGER IF EXISTS approvals_auditduplicatedelivery_append_only
    ON approvals_auditduplicatedelivery;
DROP TRIGGER IF EXISTS approvals_auditingestion_append_only ON approvals_auditingestion;
DROP FUNCTION IF EXISTS approvals_append_only();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence('approvals_auditevent', 'id')")
        (sequence,) = cursor.fetchone()
    schema_editor.execute(APPEND_ONLY_WITH_CHAIN, params=None)
    schema_editor.execute(INGESTION_APPEND_ONLY, params=None)
    register = REGISTER_WRITER.format(base=WRITER_KEY_BASE, sequence=sequence)
    schema_editor.execute(register, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(BACKWARD, params=None)
    schema_editor.execute(APPEND_ONLY_ORIGINAL, params=None)


class Migration(migrations.Migration):
    dependencies = [("approvals", "0007_audit_chain_and_ingestion")]
    operations = [migrations.RunPython(forward, backward)]
