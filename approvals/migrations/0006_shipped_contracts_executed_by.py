"""The shipped contracts say who executes them: refunds through the payments adapter
(``effect_queryable``: the payments API can be asked whether a refund exists for a key),
messages through the tenant's webhook (``unsafe``), and two tools the runtime runs itself:
``lookup_order`` (read-only) and the new ``close_case``."""

import copy
from datetime import timedelta

from django.db import migrations

_previous = __import__(
    "approvals.migrations.0003_shipped_tool_contracts", fromlist=["CONTRACTS"]
).CONTRACTS

CONTRACTS = copy.deepcopy(_previous)
for _contract in CONTRACTS:
    _contract.setdefault("max_attempts", 3)
    _contract.setdefault("retry_backoff", timedelta(seconds=2))
    if _contract["name"] == "issue_refund":
        _contract["replay_safety"] = "effect_queryable"
        # Only ASCII identifiers: a look-alike payment id must not pass for another.
        _contract["json_schema"]["properties"]["payment_id"]["pattern"] = "^[A-Za-z0-9_-]+$"
    if _contract["name"] == "lookup_order":
        # No console adapter: the runtime reads the order itself.
        _contract["adapter"] = ""

CONTRACTS.append(
    {
        "name": "close_case",
        "description": "Close a support case. The agent runtime executes it and reports "
        "the outcome.",
        "replay_safety": "unsafe",
        "risk": "medium",
        "adapter": "",
        "auto_admit": False,
        "approval_lifetime": timedelta(minutes=15),
        "approvals_required": 1,
        "quorum_amount_argument": "",
        "quorum_threshold_minor": None,
        "max_attempts": 1,
        "retry_backoff": timedelta(seconds=2),
        "json_schema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["case_id"],
            "properties": {
                "case_id": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 100,
                    "pattern": "^[A-Za-z0-9_-]+$",
                },
            },
        },
    }
)


def forward(apps, schema_editor):
    ToolContract = apps.get_model("approvals", "ToolContract")
    for contract in CONTRACTS:
        ToolContract.objects.update_or_create(name=contract["name"], defaults=contract)


def backward(apps, schema_editor):
    ToolContract = apps.get_model("approvals", "ToolContract")
    ToolContract.objects.filter(name="close_case").delete()
    for contract in _previous:
        ToolContract.objects.filter(name=contract["name"]).update(
            replay_safety=contract["replay_safety"],
            adapter=contract["adapter"],
            json_schema=contract["json_schema"],
        )


class Migration(migrations.Migration):
    dependencies = [("approvals", "0005_command_effect_and_retries")]
    operations = [migrations.RunPython(forward, backward)]
