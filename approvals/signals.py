"""What this app announces to the apps above it, which it never imports."""

from __future__ import annotations

from django.dispatch import Signal

# Sent after the transaction that created a command has committed, with ``command_id``
# and ``executed_by``. ``reconciliation`` enqueues the command's delivery when the console
# executes it. Receivers must be cheap: they run in the claim's request.
command_committed = Signal()
