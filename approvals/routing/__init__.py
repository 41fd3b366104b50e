"""Routing: who is asked to review a request.

A tenant's admins keep **reviewer groups** (a name, members, and optionally a Slack
incoming webhook and a signed generic webhook) and **routing rules** per tool contract:
which groups review its requests, optionally only within an amount band of one currency
(refunds above EUR 500.00 to ``finance-leads``), and a fallback group told when a request
is escalated (``approvals.reviews.deadlines``).

Rules are versioned: a change writes a new ``RoutingRuleVersion`` and the audit event
``routing.rule_saved`` (or ``routing.rule_removed``) with who changed what; the old
version stays, so a request keeps naming the version that routed it
(``Occurrence.routed_by``). The proposal picks the version inside its INSERT (``rules.
routing_version``): routing costs a request no query of its own.

Routing chooses who is *told* and what each reviewer's inbox shows first; it does not
change who may decide (roles, self-approval and quorum are the review services' rules).
"""
