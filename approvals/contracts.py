"""Registering a tool contract from a program (the MCP gateway derives its contracts from
the upstream servers' tools): create it, or change it, as a new version, audited.

The admin's ``/admin/`` form stays the other way to edit contracts; a registration changes
only the fields it names and never a contract that the console executes itself (one with an
adapter), whose meaning belongs to the console's own code."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from approvals.audit.record import audit_record
from approvals.errors import ErrorCode, ServiceError
from approvals.models import Tenant, ToolContract
from approvals.vocabulary import AuditKind

# What a registration may set; everything else keeps the model's default (or the admin's).
REGISTRABLE_FIELDS = frozenset(
    {
        "description",
        "json_schema",
        "replay_safety",
        "risk",
        "auto_admit",
        "approvals_required",
        "quorum_amount_argument",
        "quorum_currency_argument",
        "quorum_thresholds_minor",
        "identifying_arguments",
        "review_deadline",
        "final_deadline",
        "sensitive_arguments",
    }
)


def schema_digest(schema: Any) -> str:
    """SHA-256 of a schema's sorted JSON: the audit event names the schema it registered."""
    return hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()


def tool_contract_register(
    *, name: str, fields: dict[str, Any], tenant: Tenant, actor: str
) -> tuple[ToolContract, bool]:
    """Create the contract ``name`` with ``fields``, or change an existing one to them.

    Returns the contract and whether this registration changed it. A change bumps
    ``version`` and is audited (``tool_contract.registered``, in ``tenant``, with the
    changed fields and the schema's digest); registering the same fields again changes
    nothing and records nothing. Refused (``contract_not_registrable``): unknown fields, a
    contract with an adapter (the console executes it), fields the contract's own checks
    refuse (``ToolContract.clean``)."""
    unknown = set(fields) - REGISTRABLE_FIELDS
    if unknown:
        raise ServiceError(
            ErrorCode.CONTRACT_NOT_REGISTRABLE,
            f"A registration cannot set {', '.join(sorted(unknown))}.",
            422,
        )
    try:
        with transaction.atomic():
            contract = ToolContract.objects.select_for_update().filter(name=name).first()
            created = contract is None
            if contract is None:
                contract = ToolContract(name=name, json_schema={})
            elif contract.adapter:
                raise ServiceError(
                    ErrorCode.CONTRACT_NOT_REGISTRABLE,
                    f"The console executes {name!r} itself (adapter {contract.adapter!r}); "
                    "a registration may not change it.",
                    409,
                )
            changed = sorted(
                key for key, value in fields.items() if getattr(contract, key) != value
            )
            if not created and not changed:
                return contract, False
            for key, value in fields.items():
                setattr(contract, key, value)
            try:
                contract.full_clean(exclude=["name"] if not created else None)
            except ValidationError as exc:
                raise ServiceError(
                    ErrorCode.CONTRACT_NOT_REGISTRABLE,
                    f"The contract {name!r} is refused: {_messages(exc)}",
                    422,
                ) from exc
            if not created:
                contract.version += 1
            contract.save()
            audit_record(
                kind=AuditKind.TOOL_CONTRACT_REGISTERED,
                tenant=tenant,
                actor=actor,
                data={
                    "tool": name,
                    "version": contract.version,
                    "created": created,
                    "changed": sorted(fields) if created else changed,
                    "replay_safety": contract.replay_safety,
                    "auto_admit": contract.auto_admit,
                    "approvals_required": contract.approvals_required,
                    "schema_digest": schema_digest(contract.json_schema),
                },
            )
    except IntegrityError:
        # Another registration created it first: register again, over that one.
        return tool_contract_register(name=name, fields=fields, tenant=tenant, actor=actor)
    return contract, True


def _messages(exc: ValidationError) -> str:
    if hasattr(exc, "message_dict"):
        return "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
    return " ".join(exc.messages)
