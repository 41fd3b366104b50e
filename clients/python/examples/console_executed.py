"""A tool the console executes itself (``executed_by: console``, such as issue_refund: the
console's worker calls the payments service). The runtime proposes, waits for a person's
decision and claims; then it only waits for the effect the console records. It never calls
the payments service, and it reports no effect.

    export APPROVAL_CONSOLE_URL=http://127.0.0.1:8000 APPROVAL_CONSOLE_KEY=rk_...
    python clients/python/examples/console_executed.py

and approve (or reject) the "issue_refund" request in the console's inbox; bin/demo's
sandbox (http://127.0.0.1:8100/_sandbox/refunds) then shows the refund. Run it again with
another APPROVAL_CONSOLE_RUN_ID for a new request.
"""

import os

from approval_console import ApprovalConsole, execution_id_for
from approval_console.models import SETTLED_EFFECTS

URL = os.environ.get("APPROVAL_CONSOLE_URL", "http://127.0.0.1:8000")
KEY = os.environ["APPROVAL_CONSOLE_KEY"]  # a runtime key, rk_...
RUN_ID = os.environ.get("APPROVAL_CONSOLE_RUN_ID", "run-43")

console = ApprovalConsole(URL, KEY, long_poll=True)
proposed = console.propose(
    "issue_refund",
    {"payment_id": "pay_123", "amount_minor": 7700, "currency": "EUR", "reason": "Damaged"},
    run_id=RUN_ID,
    reason="The parcel arrived damaged",
    client_ref="call_0",
)
print("waiting for a decision on", proposed.occurrence_id)
occurrence = console.wait(proposed.occurrence_id, timeout=3600)  # until a person decides
if occurrence.status == "rejected":
    print("rejected:", occurrence.rejection_reason)
elif occurrence.status != "approved":
    print("nothing to run: the request is", occurrence.status)  # expired, revoked, claimed
else:
    execution = execution_id_for(RUN_ID, "call_0")
    token = console.pickup(occurrence.occurrence_id, execution)
    claim = console.claim(
        token,
        tool="issue_refund",
        arguments=occurrence.proposal.arguments,
        execution_id=execution,
    )
    print("claimed; executed by", claim.executed_by)  # console: its worker sends the refund
    console.watch(  # the effect changes the occurrence: long-polled until it is recorded
        occurrence.occurrence_id,
        lambda o: o.command is not None and o.command.effect_state in SETTLED_EFFECTS,
        timeout=60,
    )
    command = console.command(claim.command_id)
    # committed (with the payments service's receipt), rejected (nothing happened), or
    # outcome_unknown: an operator decides; never send it again yourself.
    print(f"effect: {command.effect_state}, receipt {command.receipt}")
console.close()
