"""A contract says which of its arguments identify an action (the payment, the recipient,
the case), for the operators' queue: a row that showed a tool and an amount did not say
which refund it was. The shipped contracts name theirs."""

from django.db import migrations, models

IDENTIFYING = {
    "issue_refund": ["payment_id"],
    "send_message": ["to"],
    "lookup_order": ["order_id"],
    "close_case": ["case_id"],
}


def forward(apps, schema_editor):
    ToolContract = apps.get_model("approvals", "ToolContract")
    for name, arguments in IDENTIFYING.items():
        ToolContract.objects.filter(name=name).update(identifying_arguments=arguments)


class Migration(migrations.Migration):
    dependencies = [("approvals", "0027_runtime_key_deactivated_at")]

    operations = [
        migrations.AddField(
            model_name="toolcontract",
            name="identifying_arguments",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="Arguments that say which action this is, shown where operators "
                'list calls: ["payment_id"]. Empty: every argument named *_id, and '
                "recipient, to, case.",
            ),
        ),
        migrations.RunPython(forward, migrations.RunPython.noop),
    ]
