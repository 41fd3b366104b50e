"""A secret on its way from the POST that minted it to the one page that shows it
(post/redirect/get): a reload of that page never posts again, and the secret is never in a
URL. The session holds it encrypted, for one redirect and at most ``HANDOFF_SECONDS``; the
page takes it out as it shows it, so a reload shows it no more."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.http import HttpRequest
from django.views.decorators.debug import sensitive_variables

from approvals.access.encryption import Purpose, secret_decrypt, secret_encrypt

HANDOFF_SECONDS = 300


@dataclass(frozen=True)
class Handoff:
    # Kept out of the repr, so that no error report or log line that prints one shows it.
    secret: str = field(repr=False)
    label: str = ""  # what the secret belongs to, in words the page shows (never secret)


@sensitive_variables("secret")
def handoff_put(
    request: HttpRequest,
    name: str,
    *,
    subject: int,
    secret: str,
    purpose: Purpose,
    label: str = "",
) -> None:
    """Keep ``secret`` for the next page that takes ``name`` for ``subject`` (a primary
    key: the page shows it only where it belongs)."""
    request.session[name] = {
        "subject": subject,
        "label": label,
        "sealed": secret_encrypt(secret, purpose=purpose),
    }


@sensitive_variables("kept")
def handoff_take(
    request: HttpRequest, name: str, *, subject: int, purpose: Purpose
) -> Handoff | None:
    """The secret kept for ``subject``, taken out of the session; None when none is kept
    for it, or it waited longer than ``HANDOFF_SECONDS``."""
    kept = request.session.get(name) or {}
    if kept.get("subject") != subject:
        return None
    del request.session[name]
    secret = secret_decrypt(kept.get("sealed", ""), purpose=purpose, ttl=HANDOFF_SECONDS)
    return Handoff(secret, kept.get("label", "")) if secret else None
