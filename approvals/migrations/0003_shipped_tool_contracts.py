"""The tool contracts the console ships with, for the demo and the tests."""

from datetime import timedelta

from django.db import migrations

CONTRACTS = [
    {
        "name": "issue_refund",
        "description": "Refund part or all of a captured card payment.",
        "replay_safety": "unsafe",
        "risk": "high",
        "adapter": "payments",
        "auto_admit": False,
        "approval_lifetime": timedelta(minutes=15),
        # Refunds over 500.00 need two distinct approvers.
        "approvals_required": 2,
        "quorum_amount_argument": "amount_minor",
        "quorum_threshold_minor": 50000,
        "json_schema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["payment_id", "amount_minor", "currency", "reason"],
            "properties": {
                "payment_id": {"type": "string", "minLength": 1, "maxLength": 100},
                "amount_minor": {"type": "integer", "minimum": 1, "maximum": 100000000000},
                "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "reason": {"type": "string", "minLength": 1, "maxLength": 500},
            },
        },
    },
    {
        "name": "send_message",
        "description": "Send an email message to a customer.",
        "replay_safety": "unsafe",
        "risk": "medium",
        "adapter": "messages",
        "auto_admit": False,
        "approval_lifetime": timedelta(minutes=15),
        "approvals_required": 1,
        "quorum_amount_argument": "",
        "quorum_threshold_minor": None,
        "json_schema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["to", "subject", "body"],
            "properties": {
                "to": {
                    "type": "string",
                    "minLength": 3,
                    "maxLength": 320,
                    "pattern": "^[^@\\s]+@[^@\\s]+$",
                },
                "subject": {"type": "string", "minLength": 1, "maxLength": 200},
                "body": {"type": "string", "minLength": 1, "maxLength": 20000},
            },
        },
    },
    {
        "name": "lookup_order",
        "description": "Read an order's status. Read-only: admitted by policy without review.",
        "replay_safety": "read_only",
        "risk": "low",
        "adapter": "orders",
        "auto_admit": True,
        "approval_lifetime": timedelta(minutes=15),
        "approvals_required": 1,
        "quorum_amount_argument": "",
        "quorum_threshold_minor": None,
        "json_schema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["order_id"],
            "properties": {"order_id": {"type": "string", "minLength": 1, "maxLength": 100}},
        },
    },
]


def forward(apps, schema_editor):
    ToolContract = apps.get_model("approvals", "ToolContract")
    for contract in CONTRACTS:
        ToolContract.objects.update_or_create(name=contract["name"], defaults=contract)


def backward(apps, schema_editor):
    ToolContract = apps.get_model("approvals", "ToolContract")
    ToolContract.objects.filter(name__in=[c["name"] for c in CONTRACTS]).delete()


class Migration(migrations.Migration):
    dependencies = [("approvals", "0002_audit_append_only")]
    operations = [migrations.RunPython(forward, backward)]
