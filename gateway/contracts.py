"""Each upstream tool's contract, derived from what the upstream says about it (its input
schema and annotations) and what the admin's configuration overrides, and registered in
the console (``approvals.contracts.tool_contract_register``: versioned, audited, listed at
``GET /api/v1/tools``).

The derivation:

- ``readOnlyHint``: ``read_only``, admitted by policy (recorded, no human), unless the
  admin asks for review (``review = true``) or marks an argument sensitive.
- otherwise a human reviews every call; ``idempotentHint`` makes it
  ``idempotent_with_key`` (the gateway sends the command's key in ``_meta``), anything
  else is ``unsafe``.
- The schema is the upstream's, closed (``additionalProperties: false``): the console
  refuses arguments the contract does not name.
- Sensitive arguments: review required, risk high, and kept off the operators' lists (the
  contract's identifying arguments never name them) and out of the gateway's messages.

Annotations are hints from a server the admin chose; the override is the admin's word.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from mcp import types

from approvals.models import ToolContract
from gateway.config import ToolOverride, Upstream

# Argument names the console takes as identifying an action (ToolContract's default rule).
_IDENTIFYING = ("id", "recipient", "to", "case", "case_number", "order", "email")


@dataclass(frozen=True)
class GatewayTool:
    """One upstream tool as the gateway offers it."""

    upstream: Upstream
    upstream_name: str
    name: str  # prefixed: the contract's name and the name clients call
    tool: types.Tool  # as offered to clients: the prefixed name, the upstream's schema
    fields: dict[str, Any]  # the contract's registrable fields
    sensitive: tuple[str, ...]

    @property
    def gated(self) -> bool:
        """Whether a call waits for a human (every tool not admitted by policy)."""
        return not self.fields["auto_admit"]


def arguments_schema(input_schema: dict[str, Any]) -> dict[str, Any]:
    """The upstream's input schema as a contract's: an object, closed to unknown keys."""
    schema = copy.deepcopy(input_schema) if isinstance(input_schema, dict) else {}
    schema.pop("$schema", None)
    schema["type"] = "object"
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    return schema


def _identifying(properties: dict[str, Any], sensitive: tuple[str, ...]) -> list[str]:
    names = [
        n for n in properties if (n.endswith("_id") or n in _IDENTIFYING) and n not in sensitive
    ]
    if not names and sensitive:
        # An empty list means "by name" to the console, which could name a sensitive one.
        names = [n for n in properties if n not in sensitive][:1]
    return names


def contract_fields(tool: types.Tool, override: ToolOverride) -> dict[str, Any]:
    """The contract of ``tool`` as ``tool_contract_register`` takes it."""
    hints = tool.annotations or types.ToolAnnotations()
    schema = arguments_schema(tool.input_schema)
    sensitive = tuple(n for n in override.sensitive if n in schema["properties"])
    if override.replay_safety:
        replay_safety = override.replay_safety
    elif hints.read_only_hint:
        replay_safety = ToolContract.ReplaySafety.READ_ONLY
    elif hints.idempotent_hint:
        replay_safety = ToolContract.ReplaySafety.IDEMPOTENT_WITH_KEY
    else:
        replay_safety = ToolContract.ReplaySafety.UNSAFE
    read_only = replay_safety == ToolContract.ReplaySafety.READ_ONLY
    auto_admit = read_only and override.review is not True and not sensitive
    if override.risk:
        risk = override.risk
    elif sensitive or hints.destructive_hint:
        risk = ToolContract.Risk.HIGH
    else:
        risk = ToolContract.Risk.LOW if read_only else ToolContract.Risk.MEDIUM
    return {
        "description": (tool.description or tool.title or tool.name)[:2000],
        "json_schema": schema,
        "replay_safety": str(replay_safety),
        "risk": str(risk),
        "auto_admit": auto_admit,
        "approvals_required": override.approvals_required or 1,
        "quorum_amount_argument": override.quorum_amount_argument,
        "quorum_currency_argument": override.quorum_currency_argument,
        "quorum_thresholds_minor": override.quorum_thresholds_minor,
        "identifying_arguments": _identifying(schema["properties"], sensitive),
        # What never leaves the console: notifications (e-mail, Slack, webhooks) omit them.
        "sensitive_arguments": list(sensitive),
        "review_deadline": override.review_deadline,
        "final_deadline": override.final_deadline,
    }


def gateway_tool(upstream: Upstream, tool: types.Tool) -> GatewayTool:
    """The upstream ``tool`` as the gateway offers and registers it."""
    override = upstream.tools.get(tool.name, ToolOverride())
    fields = contract_fields(tool, override)
    name = upstream.prefixed(tool.name)
    note = (
        "Admitted by policy (read-only)."
        if fields["auto_admit"]
        else "A person approves each call in the approval console before it runs."
    )
    offered = tool.model_copy(
        update={
            "name": name,
            "description": f"{tool.description or ''}\n\n[{upstream.name}] {note}".strip(),
        }
    )
    return GatewayTool(
        upstream=upstream,
        upstream_name=tool.name,
        name=name,
        tool=offered,
        fields=fields,
        sensitive=tuple(n for n in (upstream.tools.get(tool.name) or ToolOverride()).sensitive),
    )
