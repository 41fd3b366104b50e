"""The MCP gateway: an MCP server (``manage.py mcp_gateway``) in front of upstream MCP
servers, that puts the console's review, single-use claim and effect evidence in front of
every tool call that is not read-only. It sits above ``approvals`` and ``reconciliation``
and calls their services in-process; neither imports it (``lint-imports``)."""
