"""Plain use: propose a tool call, wait for a person's decision, then claim what was
approved, run it once and report its effect.

    export APPROVAL_CONSOLE_URL=http://127.0.0.1:8000 APPROVAL_CONSOLE_KEY=rk_...
    python clients/python/examples/plain.py

and approve (or reject) the "close_case" request in the console's inbox. A run id and a
client_ref name one request: run it again with another APPROVAL_CONSOLE_RUN_ID for a new one.
"""

import os

from approval_console import ApprovalConsole, execution_id_for

URL = os.environ.get("APPROVAL_CONSOLE_URL", "http://127.0.0.1:8000")
KEY = os.environ["APPROVAL_CONSOLE_KEY"]  # a runtime key, rk_...
RUN_ID = os.environ.get("APPROVAL_CONSOLE_RUN_ID", "run-42")


def close_the_case(case_id: str, key: str) -> str:
    """The real effect. Your CRM's call goes here, sent with the idempotency key so that a
    retried request closes the case once; what it returns is the effect's receipt."""
    print(f"CRM: closing {case_id} with idempotency key {key}")
    return f"{case_id} closed"


console = ApprovalConsole(URL, KEY, long_poll=True)  # long_poll: answered as a person decides
proposed = console.propose(
    "close_case",
    {"case_id": "case_77"},
    run_id=RUN_ID,
    reason="Solved on the phone",
    client_ref="call_0",
)
print("waiting for a decision on", proposed.occurrence_id)
occurrence = console.wait(proposed.occurrence_id, timeout=3600)  # until a person decides
if occurrence.status == "rejected":
    print("rejected:", occurrence.rejection_reason)
elif occurrence.status != "approved":
    print("nothing to run: the request is", occurrence.status)  # expired, revoked, claimed
else:
    execution = execution_id_for(RUN_ID, "call_0")  # the same after a restart
    token = console.pickup(occurrence.occurrence_id, execution)  # repr shows no secret
    claim = console.claim(
        token,
        tool="close_case",
        arguments=occurrence.proposal.arguments,  # what was approved
        execution_id=execution,
    )
    receipt = close_the_case(**occurrence.proposal.arguments, key=claim.idempotency_key)
    console.report_effect(
        claim.command_id, execution_id=execution, outcome="committed", receipt=receipt
    )
    print("committed:", receipt)
console.close()
