"""The claim as the agent API performs it: the authority's single-use claim
(``approvals.claims.claim.approval_claim``: one conditional UPDATE, the epoch, the command
and the audit event in one transaction) and then, once that transaction has committed, the
delivery of the command it created when the console executes the tool.

This is where the claim reaches dispatch; ``approvals`` never imports ``reconciliation``, so
the composition happens here, in the app that sits above it.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import transaction

from approvals.claims.claim import ClaimResult, approval_claim
from approvals.models import Command, RuntimeKey, Tenant
from approvals.vocabulary import ClaimDecision
from reconciliation.tasks import enqueue


def command_claim(
    *,
    tenant: Tenant,
    token: str,
    tool: str,
    arguments: Any,
    execution_id: str,
    message_id: str = "",
    runtime_key: RuntimeKey | None = None,
) -> ClaimResult:
    """Claim the approval (``approval_claim``, the same arguments and the same result), and
    publish the delivery of a command the console executes once the claim is committed.

    The command row is the outbox: a publish that is lost (a broker that is down, a process
    that dies after the commit) is made good by ``commands_sweep``. Only an ``approved``
    claim is delivered: a ``duplicate_delivery`` names the command its first claim
    created, which was announced then."""
    result = approval_claim(
        tenant=tenant,
        token=token,
        tool=tool,
        arguments=arguments,
        execution_id=execution_id,
        message_id=message_id,
        runtime_key=runtime_key,
    )
    command = result.command
    if (
        result.decision == ClaimDecision.APPROVED
        and command is not None
        and command.executed_by == Command.ExecutedBy.CONSOLE
    ):
        # At once when the claim ran in no outer transaction; otherwise at its commit.
        transaction.on_commit(functools.partial(enqueue, str(command.id)))
    return result
