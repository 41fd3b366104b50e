"""What the console sends out over HTTP: push callbacks (``approvals.callbacks``), the
messages webhook and the operators' escalation webhook (``reconciliation``).

``signing``: Standard Webhooks signatures (https://www.standardwebhooks.com/), made by the
``standardwebhooks`` package, beside the console's older headers. ``addresses`` and
``client`` (the network's rules): a URL names a public address unless the operator allows
otherwise, checked again on the address each connection actually reaches; every call has a
total deadline and reads at most a bounded answer.
"""
