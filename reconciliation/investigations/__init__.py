"""Investigations: from one id to the joined chain of evidence, and a verdict.

An investigator names a token fingerprint, an execution id, a command id or an occurrence
id. ``investigation_get`` finds what it names in the investigator's tenants and gathers the
chain around it (issuance, every claim decision with its producer event id, executions,
queue message ids, commands, adapter invocations, effects, and the audit events other
producers sent, with their duplicate deliveries) in a fixed number of queries, whatever
the number of rows. It turns them into plain ``Facts``.

``assess`` is a pure function of those facts. It names the stories the evidence supports,
worst first, each with the facts it rests on, and says what the evidence cannot tell:

* control failure: one fingerprint, approved decisions for two or more executions;
* idempotent execution failure: one command, two or more distinct receipts at the adapter;
* duplicated audit delivery: one producer event id delivered to the audit trail twice;
* healthy redelivery: one execution, a claim or a command delivered again, one command;
* control working: one approved execution, attempts by other executions refused.

About this console's own approvals and commands the verdict rests on the console's own
events; another producer's events that contradict them are shown as conflicts to
investigate, naming the producer (``conflicts``), never judged.

``investigation_page`` shapes both for the template.
"""
