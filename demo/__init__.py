"""The demo: a sandbox payments service and webhook receiver the console executes against
(``manage.py run_sandbox_payments``), demo tenants and people (``manage.py seed_demo``), and
a simulated agent that proposes, claims and misbehaves now and then (``manage.py
simulate_agent``).

Installed when ``CONSOLE_DEMO`` is on (``bin/demo`` and the tests turn it on; it defaults
to ``DEBUG``): a production console has none of it. Nothing in ``approvals`` or
``reconciliation`` imports it.
"""
