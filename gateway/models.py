"""The gateway's journal: one row per gated ``tools/call``, in the console's database, so
that a gateway restart picks up what an earlier process left (an approved call not yet
made) and never makes a call twice (a call it started and never saw the end of goes to the
operators as ``outcome_unknown``)."""

from __future__ import annotations

import uuid

from django.db import models

from approvals.models import Command, Occurrence


class GatewayCall(models.Model):
    """A gated tool call the gateway proposed, and how far it got with it."""

    class State(models.TextChoices):
        # Proposed; waiting for the reviewers' decision.
        PROPOSED = "proposed", "Waiting for a decision"
        # Claimed: the command exists, the upstream was not called yet.
        CLAIMED = "claimed", "Claimed"
        # The upstream call may have started (committed before it starts): a process that
        # finds a call here after a crash reports it ``outcome_unknown``, never calls again.
        CALLING = "calling", "Calling the upstream"
        # Settled: the effect is reported, or nothing will run (rejected, timed out, ...).
        DONE = "done", "Done"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    gateway = models.CharField(max_length=100, help_text="The gateway's name in its config.")
    upstream = models.CharField(max_length=100)
    upstream_tool = models.CharField(max_length=200)
    session_id = models.CharField(max_length=200, help_text="The MCP session: the run id.")
    request_id = models.CharField(max_length=100, help_text="The request id: the client ref.")
    execution_id = models.CharField(max_length=200, unique=True)
    occurrence = models.OneToOneField(
        Occurrence, on_delete=models.PROTECT, related_name="gateway_call"
    )
    command = models.OneToOneField(
        Command, on_delete=models.PROTECT, null=True, blank=True, related_name="gateway_call"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PROPOSED)
    # How it ended, in the effect's words (committed, rejected, outcome_unknown) or the
    # decision's (rejected by a reviewer, timed_out, revoked, expired).
    outcome = models.CharField(max_length=32, blank=True)
    result_digest = models.CharField(max_length=64, blank=True)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(
                fields=["gateway", "state"],
                condition=~models.Q(state="done"),
                name="gateway_call_open",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.upstream}.{self.upstream_tool} {self.execution_id} ({self.state})"
