from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class ReconciliationConfig(AppConfig):
    name = "reconciliation"
    verbose_name = "Reconciliation"

    def ready(self) -> None:
        from approvals.signals import command_committed

        command_committed.connect(_enqueue_committed, dispatch_uid="reconciliation.enqueue")


def _enqueue_committed(sender: Any, *, command_id: Any, executed_by: str, **kwargs: Any) -> None:
    """A claim committed a command: the console delivers it when an adapter executes it."""
    from approvals.models import Command
    from reconciliation.tasks import enqueue

    if executed_by == Command.ExecutedBy.CONSOLE:
        enqueue(str(command_id))
