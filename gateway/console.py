"""The gateway's side of the console: its services, called in-process (the gateway is a
management command of the console, on its database), and the journal's steps.

Every function here is synchronous and short (the server calls them in a worker thread);
each state change of the journal is a conditional update whose row count decides, in the
same transaction as the console's own change it goes with (the proposal, the claim, the
effect report), so that the journal and the console never disagree after a crash.

The steps of a gated call, each a place a ``kill -9`` may stop at:

1. ``call_open``: propose (run id = MCP session, client ref = request id) and journal it.
2. ``call_decision``: read the reviewers' decision (polled while the client waits).
3. ``call_claim``: pick up the token for the call's execution id and claim it, in one
   transaction with the journal's ``claimed``; the raw token never leaves this function.
   After a crash before the claim, the same execution picks the token up again.
4. ``call_start``: ``claimed`` → ``calling``, committed before the upstream call starts.
5. ``call_settle``: the effect reported (``command_report_effect``) and the journal
   ``done``, in one transaction. A ``calling`` row found after a crash is settled
   ``outcome_unknown``: the operators decide, the gateway never calls again.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.views.decorators.debug import sensitive_variables

from approvals.access.runtime_keys import runtime_key_authenticate
from approvals.claims.delivery import approval_deliver_token
from approvals.contracts import tool_contract_register
from approvals.errors import InputError, ServiceError
from approvals.models import Command, Occurrence, RuntimeKey, Tenant, ToolContract
from approvals.reviews.proposals import occurrence_propose
from approvals.vocabulary import ADMITTING, ReportedOutcome
from gateway.config import ConfigError, GatewayConfig, Upstream
from gateway.contracts import GatewayTool
from gateway.models import GatewayCall
from reconciliation.claims import command_claim
from reconciliation.effects import command_report_effect


@dataclass(frozen=True)
class Link:
    """The tenant and runtime key an upstream's calls are proposed under."""

    tenant: Tenant
    runtime_key: RuntimeKey


@sensitive_variables("upstream")
def link_for(upstream: Upstream) -> Link:
    key = runtime_key_authenticate(upstream.runtime_key)
    if key is None:
        raise ConfigError(f"upstreams.{upstream.name}: the runtime key is unknown or inactive")
    if key.tenant.slug != upstream.tenant:
        raise ConfigError(
            f"upstreams.{upstream.name}: the runtime key belongs to another tenant than "
            f"{upstream.tenant!r}"
        )
    return Link(tenant=key.tenant, runtime_key=key)


def contracts_register(
    config: GatewayConfig, tools: list[GatewayTool], links: dict[str, Link]
) -> tuple[int, dict[str, str]]:
    """Register every tool's contract. Returns how many registrations changed one, and the
    tools the console refused, with why: the gateway does not offer those."""
    changed, refused = 0, {}
    name_length = ToolContract._meta.get_field("name").max_length or 100
    for tool in tools:
        if len(tool.name) > name_length:
            refused[tool.name] = f"the name is longer than {name_length} characters"
            continue
        try:
            _, did = tool_contract_register(
                name=tool.name,
                fields=tool.fields,
                tenant=links[tool.upstream.name].tenant,
                actor=f"gateway:{config.name}",
            )
        except ServiceError as exc:
            refused[tool.name] = exc.message
            continue
        changed += did
    return changed, refused


def execution_id_for(gateway: str, session_id: str, request_id: str) -> str:
    """The execution that claims a call: bound to the gateway, the session and the request."""
    return f"mcp:{gateway}:{session_id}:{request_id}"[:200]


@dataclass(frozen=True)
class Opened:
    occurrence_id: uuid.UUID
    call_id: uuid.UUID | None  # None: admitted by policy, nothing to journal
    status: str


def call_open(
    *,
    gateway: str,
    link: Link,
    tool: GatewayTool,
    arguments: dict[str, Any],
    session_id: str,
    request_id: str,
    reason: str,
) -> Opened:
    """Propose the call and journal it (one transaction). The same request proposed again
    (a client retry in the same session) finds the first occurrence and its journal row.
    Raises InputError for arguments outside the contract, ServiceError for a refusal."""
    with transaction.atomic():
        occurrence, _ = occurrence_propose(
            runtime_key=link.runtime_key,
            tool=tool.name,
            arguments=arguments,
            run_id=session_id,
            reason=reason,
            client_ref=request_id,
        )
        if occurrence.status == Occurrence.Status.AUTO_ADMITTED:
            return Opened(occurrence.pk, None, occurrence.status)
        call, _ = GatewayCall.objects.get_or_create(
            occurrence=occurrence,
            defaults={
                "gateway": gateway,
                "upstream": tool.upstream.name,
                "upstream_tool": tool.upstream_name,
                "session_id": session_id,
                "request_id": request_id,
                "execution_id": execution_id_for(gateway, session_id, request_id),
            },
        )
    return Opened(occurrence.pk, call.pk, occurrence.status)


@dataclass(frozen=True)
class Decision:
    status: str  # an Occurrence.Status
    reason: str = ""


def call_decision(call_id: uuid.UUID) -> Decision:
    occurrence = Occurrence.objects.only("status", "rejection_reason").get(gateway_call=call_id)
    return Decision(occurrence.status, occurrence.rejection_reason)


@dataclass(frozen=True)
class Claimed:
    arguments: dict[str, Any]  # as approved: the reviewer's edit, if any
    idempotency_key: str


@dataclass(frozen=True)
class Refused:
    code: str  # the claim's decision, or the refusal's ErrorCode
    message: str


@sensitive_variables("delivered")
def call_claim(call_id: uuid.UUID, link: Link) -> Claimed | Refused | None:
    """Claim the approved call for its execution (the token picked up for it, again after a
    crash that lost it). None: not this process's to run (the journal moved on)."""
    with transaction.atomic():
        call = (
            GatewayCall.objects.select_for_update(of=("self",))
            .select_related("occurrence__tool", "command__approval__proposal")
            .get(pk=call_id)
        )
        if call.state == GatewayCall.State.CLAIMED:
            return _claimed(call)
        if call.state != GatewayCall.State.PROPOSED:
            return None
        try:
            delivered = approval_deliver_token(
                occurrence=call.occurrence,
                runtime_key=link.runtime_key,
                execution_id=call.execution_id,
            )
        except ServiceError as exc:
            refused = Refused(str(exc.code), exc.message)
        else:
            result = command_claim(
                tenant=link.tenant,
                token=delivered.token,
                tool=call.occurrence.tool.name,
                arguments=delivered.approval.proposal.arguments,
                execution_id=call.execution_id,
                runtime_key=link.runtime_key,
            )
            if result.decision in ADMITTING and result.command is not None:
                call.command = result.command
                call.state = GatewayCall.State.CLAIMED
                call.save(update_fields=["command", "state", "updated_at"])
                return _claimed(call)
            refused = Refused(str(result.decision), f"The claim was refused: {result.reason}.")
        # Nothing will run: the refusal (audited by the claim) and the closed row commit.
        call.state = GatewayCall.State.DONE
        call.outcome = refused.code[:32]
        call.detail = refused.message[:2000]
        call.save(update_fields=["state", "outcome", "detail", "updated_at"])
        return refused


def _claimed(call: GatewayCall) -> Claimed:
    command = call.command
    assert command is not None and command.approval is not None
    proposal = command.approval.proposal
    return Claimed(arguments=proposal.arguments, idempotency_key=command.idempotency_key)


def call_start(call_id: uuid.UUID) -> bool:
    """``claimed`` → ``calling``, committed before the upstream call: whether this process
    won the right to make the one call."""
    return (
        GatewayCall.objects.filter(pk=call_id, state=GatewayCall.State.CLAIMED).update(
            state=GatewayCall.State.CALLING
        )
        == 1
    )


def call_settle(
    call_id: uuid.UUID, link: Link, *, outcome: str, result_digest: str = "", detail: str = ""
) -> None:
    """Report the effect of the upstream call and close the journal row, in one transaction."""
    with transaction.atomic():
        call = (
            GatewayCall.objects.select_for_update(of=("self",))
            .select_related("command")
            .get(pk=call_id)
        )
        if call.state != GatewayCall.State.CALLING or call.command is None:
            return
        try:
            command_report_effect(
                tenant=link.tenant,
                command_id=call.command.pk,
                execution_id=call.execution_id,
                outcome=ReportedOutcome(outcome),
                actor=f"gateway:{call.gateway}",
                receipt=result_digest,
                detail=detail[:2000],
            )
        except ServiceError as exc:
            # The effect moved on without the gateway (an operator settled it while the
            # gateway was down): the console's record stands; the journal says so and closes,
            # rather than retrying the report at every start.
            detail = f"{detail} (report refused: {exc.code}: {exc.message})".strip()
        GatewayCall.objects.filter(pk=call_id).update(
            state=GatewayCall.State.DONE,
            outcome=outcome,
            result_digest=result_digest,
            detail=detail[:2000],
        )


def call_close(call_id: uuid.UUID, *, outcome: str, detail: str = "") -> None:
    """Close a call that will not run (rejected, timed out, revoked, expired)."""
    GatewayCall.objects.filter(pk=call_id, state=GatewayCall.State.PROPOSED).update(
        state=GatewayCall.State.DONE, outcome=outcome, detail=detail[:2000]
    )


def calls_open(gateway: str) -> list[tuple[uuid.UUID, str, str, str]]:
    """The journal rows an earlier process of this gateway left unfinished:
    (id, state, upstream, upstream tool), oldest first."""
    return list(
        GatewayCall.objects.filter(gateway=gateway)
        .exclude(state=GatewayCall.State.DONE)
        .values_list("id", "state", "upstream", "upstream_tool")
    )


def command_state(call_id: uuid.UUID) -> str:
    command = Command.objects.filter(gateway_call=call_id).only("state").first()
    return command.state if command is not None else ""


def refusal_text(exc: InputError | ServiceError) -> str:
    """A refusal as the model reads it: the code and the message (details as JSON)."""
    details = getattr(exc, "details", None)
    extra = f" {json.dumps(details, default=str)}" if details else ""
    return f"{exc.code}: {exc.message}{extra}"
