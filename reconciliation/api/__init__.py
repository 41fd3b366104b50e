"""The agent API's execution endpoints (a command's evidence, a runtime's report of an
effect, another epoch), mounted on the v1 API in ``config.urls``."""
