"""Issue 27 §3: each upstream tool's contract, derived from its schema and annotations and
overridden by the admin's configuration, and its registration in the console (versioned,
audited, listed at ``GET /api/v1/tools``). No processes: the derivation and the service."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from mcp import types

from approvals.contracts import tool_contract_register
from approvals.errors import ServiceError
from approvals.models import AuditEvent, NotificationEvent, Tenant, ToolContract
from approvals.notifications.content import message
from approvals.vocabulary import AuditKind, ReportedOutcome
from gateway import calls, console
from gateway.config import ConfigError, parse_config
from gateway.contracts import arguments_schema, contract_fields, gateway_tool
from gateway.upstreams import Effect
from tests.conftest import PASSWORD, Runtime

SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "card_number": {"type": "string"},
        "amount_minor": {"type": "integer"},
        "currency": {"type": "string"},
    },
    "required": ["order_id"],
}

CONFIG = """
[gateway]
name = "gw"
[upstreams.shop]
command = ["python", "-m", "demo.mcp_shop"]
tenant = "acme"
runtime_key_env = "KEY"
[upstreams.shop.tools.refund]
approvals_required = 2
quorum_amount_argument = "amount_minor"
quorum_currency_argument = "currency"
quorum_thresholds_minor = { EUR = 50000 }
sensitive = ["card_number"]
[upstreams.shop.tools.lookup]
review = true
"""


def tool(name: str, **hints: Any) -> types.Tool:
    return types.Tool(
        name=name,
        description=f"{name} things",
        input_schema=SCHEMA,
        annotations=types.ToolAnnotations(**hints) if hints else None,
    )


def upstream(text: str = CONFIG) -> Any:
    return parse_config(text, environ={"KEY": "rk_test"}).upstreams[0]


def test_read_only_hint_passes_by_policy_other_tools_need_a_person() -> None:
    shop = upstream("[upstreams.shop]\nurl='http://x/mcp'\ntenant='a'\nruntime_key_env='KEY'")
    read = gateway_tool(shop, tool("lookup", read_only_hint=True))
    idempotent = gateway_tool(shop, tool("refund", idempotent_hint=True))
    plain = gateway_tool(shop, tool("send"))

    assert read.name == "shop__lookup" and read.tool.name == "shop__lookup"
    assert (read.fields["replay_safety"], read.fields["auto_admit"]) == ("read_only", True)
    assert not read.gated
    assert idempotent.fields["replay_safety"] == "idempotent_with_key" and idempotent.gated
    assert plain.fields["replay_safety"] == "unsafe" and plain.gated
    assert "approves each call" in (plain.tool.description or "")


def test_the_schema_is_closed_to_unknown_arguments() -> None:
    schema = arguments_schema({"$schema": "x", "properties": {"a": {"type": "string"}}})
    assert schema["additionalProperties"] is False and schema["type"] == "object"
    assert "$schema" not in schema


def test_admin_overrides_review_quorum_and_sensitive_arguments() -> None:
    shop = upstream()
    lookup = contract_fields(tool("lookup", read_only_hint=True), shop.tools["lookup"])
    refund = contract_fields(tool("refund", idempotent_hint=True), shop.tools["refund"])

    # review = true: a person reviews even a read-only tool.
    assert lookup["replay_safety"] == "read_only" and lookup["auto_admit"] is False
    assert refund["approvals_required"] == 2
    assert refund["quorum_thresholds_minor"] == {"EUR": 50000}
    # Sensitive: risk high, never named where operators list calls.
    assert refund["risk"] == "high"
    assert "card_number" not in refund["identifying_arguments"]
    assert refund["identifying_arguments"] == ["order_id"]
    # ... and never in a notification (approvals.notifications.content reads the contract).
    assert refund["sensitive_arguments"] == ["card_number"]
    assert lookup["sensitive_arguments"] == []


def test_a_registered_sensitive_argument_stays_out_of_notifications(
    tenant: Tenant, runtime: Runtime
) -> None:
    refund = contract_fields(tool("refund", idempotent_hint=True), upstream().tools["refund"])
    contract, _ = tool_contract_register(
        name="shop__refund", fields=refund, tenant=tenant, actor="gateway:gw"
    )
    assert contract.sensitive_arguments == ["card_number"]
    answer = runtime.propose(
        tool="shop__refund", arguments={"order_id": "ord_1", "card_number": "4111111111111111"}
    )
    assert answer.status_code == 201, answer.content
    event = NotificationEvent.objects.get(occurrence_id=answer.json()["occurrence_id"])
    told = json.dumps(message(event))
    assert "4111111111111111" not in told and "ord_1" in told


def test_a_sensitive_argument_of_a_read_only_tool_needs_review() -> None:
    shop = upstream(CONFIG.replace("review = true", 'sensitive = ["card_number"]'))
    fields = contract_fields(tool("lookup", read_only_hint=True), shop.tools["lookup"])
    assert fields["auto_admit"] is False


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", "upstreams"),
        ("[upstreams.shop]\ntenant='a'\nruntime_key_env='KEY'", "command"),
        ("[upstreams.shop]\nurl='u'\ntenant='a'", "runtime_key_env"),
        ("[upstreams.shop]\nurl='u'\ntenant='a'\nruntime_key_env='NOPE'", "NOPE"),
        ("[upstreams.'a b']\nurl='u'\ntenant='a'\nruntime_key_env='KEY'", "upstreams.a b"),
        (CONFIG + "\n[upstreams.shop.tools.x]\nquorum = 2\n", "unknown keys quorum"),
        (CONFIG + "\n[upstreams.shop.tools.x]\nreplay_safety = 'safe'\n", "replay_safety"),
        ("not toml [", "not TOML"),
    ],
)
def test_config_mistakes_name_the_key(text: str, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        parse_config(text, environ={"KEY": "rk"})


def test_the_runtime_key_comes_from_the_environment_never_the_file() -> None:
    assert upstream().runtime_key == "rk_test"


FIELDS: dict[str, Any] = {
    "description": "Refund",
    "json_schema": {**SCHEMA, "additionalProperties": False},
    "replay_safety": "idempotent_with_key",
    "risk": "medium",
    "auto_admit": False,
    "approvals_required": 1,
    "review_deadline": None,
    "final_deadline": timedelta(minutes=10),
}


def test_registration_creates_then_versions_each_change_once(tenant: Tenant) -> None:
    contract, changed = tool_contract_register(
        name="shop__refund", fields=FIELDS, tenant=tenant, actor="gateway:gw"
    )
    assert changed and contract.version == 1
    again, changed_again = tool_contract_register(
        name="shop__refund", fields=FIELDS, tenant=tenant, actor="gateway:gw"
    )
    assert not changed_again and again.version == 1
    changed_fields = {**FIELDS, "approvals_required": 2}
    newer, changed = tool_contract_register(
        name="shop__refund", fields=changed_fields, tenant=tenant, actor="gateway:gw"
    )
    assert changed and newer.version == 2 and newer.approvals_required == 2

    events = list(AuditEvent.objects.filter(kind=AuditKind.TOOL_CONTRACT_REGISTERED).order_by("id"))
    assert [(e.data["version"], e.data["created"]) for e in events] == [(1, True), (2, False)]
    assert events[1].data["changed"] == ["approvals_required"]
    assert events[1].actor == "gateway:gw" and events[1].tenant_id == tenant.pk


def test_registration_refuses_what_the_contract_refuses(tenant: Tenant) -> None:
    with pytest.raises(ServiceError) as refused:
        tool_contract_register(
            name="shop__bad",
            fields={**FIELDS, "auto_admit": True},  # auto-admitted but not read-only
            tenant=tenant,
            actor="gateway:gw",
        )
    assert refused.value.code == "contract_not_registrable"
    assert not ToolContract.objects.filter(name="shop__bad").exists()
    with pytest.raises(ServiceError):
        tool_contract_register(
            name="shop__bad", fields={"adapter": "payments"}, tenant=tenant, actor="gw"
        )


def test_registration_never_changes_a_console_executed_contract(tenant: Tenant) -> None:
    shipped = ToolContract.objects.get(name="issue_refund")
    assert shipped.adapter
    with pytest.raises(ServiceError) as refused:
        tool_contract_register(name="issue_refund", fields=FIELDS, tenant=tenant, actor="gw")
    assert refused.value.status == 409
    shipped.refresh_from_db()
    assert shipped.version == 1


def test_registered_contracts_are_listed_with_their_version(
    tenant: Tenant, runtime: Runtime
) -> None:
    tool_contract_register(name="shop__refund", fields=FIELDS, tenant=tenant, actor="gw")
    tool_contract_register(
        name="shop__refund", fields={**FIELDS, "risk": "high"}, tenant=tenant, actor="gw"
    )
    listed = {t["name"]: t for t in runtime.client.get("/api/v1/tools").json()["tools"]}
    assert listed["shop__refund"]["version"] == 2
    assert listed["shop__refund"]["replay_safety"] == "idempotent_with_key"
    assert listed["issue_refund"]["version"] == 1


def test_staff_read_the_journal_in_the_admin_and_cannot_change_it(tenant: Tenant) -> None:
    get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)
    client = Client()
    assert client.login(username="root", password=PASSWORD)
    assert client.get("/admin/gateway/gatewaycall/").status_code == 200
    assert client.get("/admin/gateway/gatewaycall/add/").status_code == 403


def test_a_tool_whose_contract_the_console_refuses_is_not_offered(
    tenant: Tenant, runtime: Runtime
) -> None:
    config = parse_config(
        "[upstreams.shop]\nurl='http://x/mcp'\ntenant='acme'\nruntime_key_env='KEY'",
        environ={"KEY": runtime.raw_key},
    )
    shop = config.upstreams[0]
    broken = types.Tool(name="broken", input_schema={"properties": {"a": {"type": 5}}})
    tools = [
        gateway_tool(shop, tool("fine")),
        gateway_tool(shop, broken),
        gateway_tool(shop, tool("x" * 100)),
    ]
    links = {"shop": console.Link(tenant=tenant, runtime_key=runtime.key)}

    changed, refused = console.contracts_register(config, tools, links)

    assert changed == 1
    assert sorted(refused) == ["shop__broken", "shop__" + "x" * 100]
    assert "Invalid JSON Schema" in refused["shop__broken"]
    assert ToolContract.objects.filter(name="shop__fine").exists()


def test_the_edit_note_names_the_arguments_that_ran_but_no_sensitive_value() -> None:
    ran = types.CallToolResult(content=[types.TextContent(type="text", text="ok")])
    effect = Effect(ReportedOutcome.COMMITTED, "digest", "", ran)
    answer = calls._answer(
        effect,
        {"order_id": "o1", "card_number": "4111", "amount_minor": 100},
        {"order_id": "o1", "card_number": "4111", "amount_minor": 900},
        ("card_number",),
    )
    note = answer.content[0]
    assert isinstance(note, types.TextContent)
    assert '"amount_minor": 100' in note.text and "4111" not in note.text
    assert answer.content[1] == ran.content[0]
    unchanged = calls._answer(effect, {"a": 1}, {"a": 1})
    assert unchanged.content == ran.content
