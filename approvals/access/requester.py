"""Who the agent says asked: one rule, for the review page and every notification.

``requested_by`` is agent-supplied text. A reviewer must read the same warning on the review
page as in her e-mail, Slack message or webhook, so both ask this module."""

from __future__ import annotations

from typing import Any

from approvals.access.tenancy import tenant_members
from approvals.canonical.confusables import is_hidden, look_alikes, member_named, plain_reveal

UNVERIFIED = "unverified: "


def requester_marks(requested_by: str, tenant_id: int, tenant_name: str) -> dict[str, Any]:
    """The agent-supplied requester, marked: hidden characters shown as ``\\uXXXX``
    (``shown``), and a ``note`` when it names no member of the tenant (unverified) or names
    one written differently. ``look_alike`` when a reader could take it for a console
    user's name it is not spelled as (look-alike letters, hidden characters, or a TR39
    confusable such as ``rn`` for ``m``); the member's own name or address in another case
    is only named (``member rita``). JSON-ready (the generic webhook sends it as is).

    Reads the tenant's members once, only when a requester is given."""
    if not requested_by:
        return {"shown": "", "member": "", "verified": False, "look_alike": False, "note": ""}
    shown = plain_reveal(requested_by)
    reasons = [reason for found in look_alikes(requested_by) for reason in found.reasons]
    hidden = sum(1 for char in requested_by if is_hidden(char))
    if hidden:
        reasons.append(f"{hidden} invisible character{'s' if hidden > 1 else ''}")
    match = member_named(requested_by, tenant_members(tenant_id))
    if match is None:
        note = (
            f"{UNVERIFIED}no member of {tenant_name} has this name or e-mail address; "
            "the agent says so, nothing confirms it"
        )
        if reasons:
            note += f" ({'; '.join(reasons)})"
        return {"shown": shown, "member": "", "verified": False, "look_alike": False, "note": note}
    username, email = match
    plainly = requested_by.strip().casefold() in {username.casefold(), email.casefold()}
    if plainly:
        # The member's own name or address, at most in another case.
        note = "" if requested_by == username else f"member {username}"
    else:
        spelled = "; ".join(reasons) or "its letters only look like theirs"
        note = f"looks like the console user {username} but is written differently: {spelled}"
    return {
        "shown": shown,
        "member": username,
        "verified": True,
        "look_alike": not plainly,
        "note": note,
    }
