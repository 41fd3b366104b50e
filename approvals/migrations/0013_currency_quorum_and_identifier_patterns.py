"""Quorum thresholds per currency, and identifiers a look-alike cannot pass for.

The refund contract's threshold was 50000 minor units whatever the currency: EUR 500.00,
but also 50,000 yen (JPY has no minor unit) or 50.000 dinars (KWD has three). It is now one
threshold per currency, each in that currency's minor units, about 500 EUR rounded down to
a round amount at 2025 rates; a currency without a threshold needs the quorum.

The single ``quorum_threshold_minor`` stays for amounts without a currency; the shipped
refund contract no longer uses it.

Identifier arguments accept ASCII only: ``send_message.to`` an ASCII address (an
internationalized domain in its ``xn--`` form), ``lookup_order.order_id`` letters, digits,
``_`` and ``-`` like ``payment_id`` and ``case_id`` already do.
"""

import copy

from django.db import migrations, models

_previous = __import__(
    "approvals.migrations.0006_shipped_contracts_executed_by", fromlist=["CONTRACTS"]
).CONTRACTS

# In minor units of each currency. USD 500.00 is about 430-470 EUR, GBP 400.00 about 460-480,
# CHF 450.00 about 470-490, JPY 75,000 (no minor unit) about 430-470 at 2025 rates: each at
# or below the euro's 500.00, so no currency gets a laxer rule than the euro.
REFUND_THRESHOLDS = {"EUR": 50000, "USD": 50000, "GBP": 40000, "CHF": 45000, "JPY": 75000}

IDENTIFIER = "^[A-Za-z0-9_-]+$"
# An address a reviewer reads one way only: an ASCII local part and ASCII domain labels.
ASCII_EMAIL = (
    "^[A-Za-z0-9._%+-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    "(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"
)

CONTRACTS = copy.deepcopy(_previous)
for _contract in CONTRACTS:
    _contract.setdefault("quorum_currency_argument", "")
    _contract.setdefault("quorum_thresholds_minor", {})
    _properties = _contract["json_schema"]["properties"]
    if _contract["name"] == "issue_refund":
        _contract["quorum_currency_argument"] = "currency"
        _contract["quorum_thresholds_minor"] = dict(REFUND_THRESHOLDS)
        _contract["quorum_threshold_minor"] = None
    if _contract["name"] == "send_message":
        _properties["to"]["pattern"] = ASCII_EMAIL
    if _contract["name"] == "lookup_order":
        _properties["order_id"]["pattern"] = IDENTIFIER

_CHANGED = ["issue_refund", "send_message", "lookup_order"]
_FIELDS = [
    "json_schema",
    "quorum_currency_argument",
    "quorum_thresholds_minor",
    "quorum_threshold_minor",
]


def forward(apps, schema_editor):
    ToolContract = apps.get_model("approvals", "ToolContract")
    for contract in CONTRACTS:
        if contract["name"] in _CHANGED:
            ToolContract.objects.filter(name=contract["name"]).update(
                **{name: contract[name] for name in _FIELDS}
            )


def backward(apps, schema_editor):
    ToolContract = apps.get_model("approvals", "ToolContract")
    for contract in _previous:
        if contract["name"] in _CHANGED:
            ToolContract.objects.filter(name=contract["name"]).update(
                json_schema=contract["json_schema"],
                quorum_threshold_minor=contract["quorum_threshold_minor"],
            )


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0012_runtime_key_binding_and_rate_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="toolcontract",
            name="quorum_currency_argument",
            field=models.CharField(
                blank=True,
                help_text="String argument holding the amount's ISO 4217 currency, e.g. currency. With it, thresholds are per currency (below).",
                max_length=100,
            ),
        ),
        migrations.AddField(
            model_name="toolcontract",
            name="quorum_thresholds_minor",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text='Per currency, in its minor units: {"EUR": 50000, "JPY": 75000} (JPY has no minor unit: 75000 is 75,000 yen). The quorum applies above a currency\'s threshold, and always for a currency that has none here.',
            ),
        ),
        migrations.AlterField(
            model_name="toolcontract",
            name="quorum_threshold_minor",
            field=models.BigIntegerField(
                blank=True,
                help_text="Only for an amount without a currency argument: the quorum applies when the amount argument is above this value.",
                null=True,
            ),
        ),
        migrations.RunPython(forward, backward),
    ]
