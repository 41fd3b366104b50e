"""``/api/v1/callback``: the runtime key's push callback, registered, read and removed."""

from __future__ import annotations

from typing import Any

from django.http import (
    Http404,
    HttpRequest,
)
from ninja import Field, Router, Schema, Status
from pydantic import StrictBool, StrictStr

from approvals.api import openapi
from approvals.api.base import runtime_key_of
from approvals.api.errors import AUTH_ERRORS, BODY_ERRORS, ErrorOut
from approvals.api.schemas import StrictSchema
from approvals.callbacks.registry import callback_register, callback_remove, summary
from approvals.models import (
    RuntimeCallback,
)

router = Router()


class CallbackIn(StrictSchema):
    url: StrictStr = Field(
        ...,
        min_length=1,
        max_length=2000,
        # Documented, not enforced here: the service names what is wrong (invalid_url,
        # https_required, private_host) where a pattern would say only invalid_field.
        json_schema_extra={"pattern": openapi.CALLBACK_URL},
        description="Where each decision on this key's requests is POSTed (https). 422 "
        "`invalid_url` for another scheme, spaces or control characters, or credentials "
        "in it, `https_required` for http unless the console "
        "allows it, `private_host` for a loopback or private address.",
        examples=["https://agents.example.com/console-callback"],
    )
    rotate_secret: StrictBool = Field(
        False, description="Mint a new signing secret (the answer shows it once)."
    )


class CallbackOut(Schema):
    url: str
    active: bool
    secret: str | None = Field(
        None,
        description="The signing secret, shown only when the callback is first registered "
        "or its secret rotated; keep it: the console never shows it again.",
    )
    deliveries: dict[str, int] = Field(..., description="This callback's deliveries by state.")


def _callback_out(callback: Any, secret: str = "") -> dict[str, Any]:
    return {
        "url": callback.url,
        "active": callback.is_active,
        "secret": secret or None,
        "deliveries": summary(callback),
    }


@router.put(
    "/callback",
    response={200: CallbackOut, **AUTH_ERRORS, **BODY_ERRORS},
    summary="Register this runtime key's callback URL: decisions are pushed to it",
    description="Each decision on a request this key proposed (`approved`, `rejected`, "
    "`expired`, `edited`) is POSTed to the URL as JSON, signed twice. As Standard Webhooks "
    "(https://www.standardwebhooks.com/) signs: `webhook-id` (the delivery id), "
    "`webhook-timestamp` and `webhook-signature`, which "
    "`standardwebhooks.Webhook(secret).verify(body, headers)` checks. And as before: "
    '`X-Console-Signature: sha256=HMAC-SHA256(secret, "<X-Console-Timestamp>.<body>")`, '
    "with `X-Console-Delivery` the same on every retry. Retried with backoff until a 2xx. "
    "The first registration (or `rotate_secret`) answers the secret, once: `whsec_` and "
    "base64, as Standard Webhooks spells one (a secret minted before, in URL-safe base64, "
    "is read by `Webhook` once `-` and `_` are written `+` and `/`).",
)
def callback_put(request: HttpRequest, payload: CallbackIn) -> dict[str, Any]:
    registered = callback_register(
        runtime_key=runtime_key_of(request), url=payload.url, rotate=payload.rotate_secret
    )
    return _callback_out(registered.callback, registered.secret)


@router.get(
    "/callback",
    response={200: CallbackOut, **AUTH_ERRORS, 404: ErrorOut},
    summary="This runtime key's callback, and its deliveries by state",
)
def callback_get(request: HttpRequest) -> dict[str, Any]:
    callback = RuntimeCallback.objects.filter(runtime_key=runtime_key_of(request)).first()
    if callback is None:
        raise Http404
    return _callback_out(callback)


@router.delete(
    "/callback",
    response={204: None, **AUTH_ERRORS, 404: ErrorOut},
    summary="Stop pushing decisions to this runtime key's callback",
)
def callback_delete(request: HttpRequest) -> Status[None]:
    if not callback_remove(runtime_key=runtime_key_of(request)):
        raise Http404
    return Status(204, None)
