"""Tool contracts: their schema is checked when saved through a form, and the quorum rule."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.sites import site
from django.core.exceptions import ValidationError
from django.test import Client

from approvals.models import ToolContract

VALID_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["path"],
    "properties": {"path": {"type": "string"}},
}


def contract(**fields: Any) -> ToolContract:
    defaults: dict[str, Any] = {"name": "delete_file", "json_schema": VALID_SCHEMA}
    return ToolContract(**{**defaults, **fields})


@pytest.mark.django_db
def test_a_valid_contract_passes_full_clean() -> None:
    contract().full_clean()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ([], "must be a JSON object"),
        ({"type": "object", "properties": {"a": {"type": "nope"}}}, "Invalid JSON Schema"),
        ({"type": "array", "additionalProperties": False}, '"type": "object"'),
        ({"type": "object", "properties": {}}, '"additionalProperties": false'),
    ],
)
def test_an_invalid_schema_is_refused_with_the_reason(schema: Any, problem: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        contract(json_schema=schema).full_clean()
    assert problem in str(excinfo.value.message_dict["json_schema"])


@pytest.mark.django_db
def test_only_read_only_tools_may_be_auto_admitted() -> None:
    with pytest.raises(ValidationError) as excinfo:
        contract(auto_admit=True, replay_safety=ToolContract.ReplaySafety.UNSAFE).full_clean()
    assert "auto_admit" in excinfo.value.message_dict


@pytest.mark.django_db
def test_quorum_needs_both_the_argument_and_the_threshold() -> None:
    with pytest.raises(ValidationError):
        contract(quorum_amount_argument="amount_minor").full_clean()


@pytest.mark.django_db
def test_shipped_refund_contract_needs_two_approvers_only_above_500() -> None:
    refund = ToolContract.objects.get(name="issue_refund")
    assert refund.approvals_needed({"amount_minor": 50000, "currency": "EUR"}) == 1
    assert refund.approvals_needed({"amount_minor": 50001, "currency": "EUR"}) == 2
    assert ToolContract.objects.get(name="send_message").approvals_needed({}) == 1


@pytest.mark.django_db
def test_admin_form_refuses_a_schema_that_allows_unknown_arguments(
    django_user_model: Any, client: Client
) -> None:
    # tests/conftest.py's admin_user is a tenant admin, not a Django superuser.
    superuser = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(superuser)
    assert ToolContract in site._registry
    response = client.post(
        "/admin/approvals/toolcontract/add/",
        {
            "name": "delete_file",
            "description": "",
            "json_schema": '{"type": "object", "properties": {}}',
            "replay_safety": "unsafe",
            "risk": "high",
            "adapter": "",
            "approval_lifetime": "00:15:00",
            "approvals_required": "1",
            "quorum_amount_argument": "",
            "quorum_threshold_minor": "",
        },
    )
    assert response.status_code == 200
    assert "additionalProperties" in response.content.decode()
    assert not ToolContract.objects.filter(name="delete_file").exists()


@pytest.mark.django_db
def test_quorum_must_name_an_integer_argument_of_the_schema() -> None:
    # A typo would otherwise make approvals_needed() return 1 forever.
    with pytest.raises(ValidationError) as excinfo:
        contract(quorum_amount_argument="amount", quorum_threshold_minor=100).full_clean()
    assert "quorum_amount_argument" in excinfo.value.message_dict
    with pytest.raises(ValidationError):
        contract(quorum_amount_argument="path", quorum_threshold_minor=100).full_clean()
