"""The agent API v1 (``/api/v1/``): one router per resource, mounted here on the API of
``approvals.api.base`` (authentication, rate limit, error envelope). ``reconciliation``
mounts its own routers on it in ``config.urls`` (the claim, which composes the authority's
claim with the command's delivery, and the execution endpoints); the OpenAPI document
(``/api/v1/docs``) covers both."""

from approvals.api import audit, callbacks, occurrences, tools
from approvals.api.base import api

for _resource in (occurrences, callbacks, tools, audit):
    api.add_router("", _resource.router)

__all__ = ["api"]
