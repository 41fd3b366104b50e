"""The console's own system checks: settings Django's checks cannot judge.

``manage.py check --deploy`` (which ``bin/serve`` runs before it starts anything, failing
at ERROR) warns about what makes a deployment reachable or callable where it should not
be, and refuses a deployment without ``PAYMENTS_URL`` (an error with DEBUG off): the console
would call nothing, where it used to call the sandbox's loopback address.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register


@register(Tags.security, deploy=True)
def check_allowed_hosts(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    if "*" not in settings.ALLOWED_HOSTS:
        return []
    return [
        Warning(
            "ALLOWED_HOSTS contains '*': the console answers a request for any Host, which "
            "turns off Django's defence against Host header attacks (absolute URLs and "
            "redirects built from a host of the requester's choosing).",
            hint="Name the console's own host(s): ALLOWED_HOSTS=console.example.com",
            id="console.W001",
        )
    ]


@register(Tags.security, deploy=True)
def check_callback_targets(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    found: list[CheckMessage] = []
    if getattr(settings, "CALLBACK_ALLOW_PRIVATE_HOSTS", False):
        found.append(
            Warning(
                "CALLBACK_ALLOW_PRIVATE_HOSTS is on: a runtime key may register a callback "
                "URL on loopback or private addresses, and the console's workers will POST "
                "to services inside its own network.",
                hint="Unset CALLBACK_ALLOW_PRIVATE_HOSTS outside development.",
                id="console.W002",
            )
        )
    if getattr(settings, "CALLBACK_ALLOW_HTTP", False):
        found.append(
            Warning(
                "CALLBACK_ALLOW_HTTP is on: decisions may be posted to callback URLs over "
                "plain HTTP, readable and alterable on the way.",
                hint="Unset CALLBACK_ALLOW_HTTP outside development.",
                id="console.W003",
            )
        )
    return found


@register(deploy=True)
def check_adapter_urls(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """Where the adapters call (reconciliation.adapters). The sandbox default exists only
    where the demo is installed (config/settings.py), so a deployment names them. A
    deployment check: ``makemigrations`` or ``migrate`` on a machine that is no deployment
    need no payments API."""
    found: list[CheckMessage] = []
    if not settings.PAYMENTS_URL:
        # The only payments endpoint there is: without it no refund can be executed.
        kind = Warning if settings.DEBUG else Error
        found.append(
            kind(
                "PAYMENTS_URL is not set: the refund adapter has no payments API to call.",
                hint="Set PAYMENTS_URL to the payments API's https:// URL.",
                id="console.W004" if settings.DEBUG else "console.E001",
            )
        )
    if not settings.MESSAGES_WEBHOOK_URL:
        # A fallback: a tenant's own webhook (the credentials page) takes precedence.
        found.append(
            Warning(
                "MESSAGES_WEBHOOK_URL is not set: send_message commands of a tenant without "
                "a webhook of its own (Admin, Adapter credentials) cannot be delivered.",
                hint="Set MESSAGES_WEBHOOK_URL, or give every tenant its own webhook.",
                id="console.W005",
            )
        )
    return found
