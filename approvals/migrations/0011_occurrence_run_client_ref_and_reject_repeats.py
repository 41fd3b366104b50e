"""A client_ref is unique per run, not per tenant: frameworks reuse tool-call ids (call_0)
across runs. An index for a run's earlier decisions, and the contract option that rejects a
repeat of a rejected action without a review."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("approvals", "0010_occurrence_expired_status")]

    operations = [
        migrations.RemoveConstraint(model_name="occurrence", name="occurrence_client_ref_unique"),
        migrations.AddConstraint(
            model_name="occurrence",
            constraint=models.UniqueConstraint(
                condition=models.Q(("client_ref", ""), _negated=True),
                fields=("tenant", "run_id", "client_ref"),
                name="occurrence_run_client_ref_unique",
            ),
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(fields=["tenant", "run_id", "status"], name="occurrence_run_status"),
        ),
        migrations.AddField(
            model_name="toolcontract",
            name="reject_repeats",
            field=models.BooleanField(
                default=False,
                help_text="Reject, without a review, a proposal repeating an action a "
                "reviewer already rejected in the same run (same digest); the original reason "
                "is kept.",
            ),
        ),
    ]
