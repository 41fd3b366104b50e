"""A group's Slack app: messages posted with Slack's Web API (``chat.postMessage``) with
the group's bot token, to its channel. Unlike an incoming webhook, Slack answers with the
message's ``ts``: the request's message records it (``NotificationDelivery.slack_ts``), and
what follows (the escalation, the decision) is posted as a reply in its thread.

Slack answers 200 with ``{"ok": true, "ts": …}``, or ``{"ok": false, "error": …}``: an
error no later attempt can mend (a revoked token, a channel the bot is not in) gives up, a
rate limit (``ratelimited``, HTTP 429) or Slack's own trouble is retried with the outbox's
backoff. The token goes in the ``Authorization`` header only: never in a URL, an error or
a log line."""

from __future__ import annotations

import json
from typing import Any

import httpx
from django.conf import settings
from django.views.decorators.debug import sensitive_variables

from approvals.models import Channel, NotificationDelivery, NotificationEvent, ReviewerGroup
from approvals.outbound.client import outbound_client
from approvals.outbound.outbox import Sent
from approvals.routing.changes import group_secret_decrypt

# Errors no later attempt mends: the app, its token or its channel must change first.
GIVE_UP = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "no_permission",
        "missing_scope",
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "restricted_action",
        "ekm_access_denied",
        "team_access_not_granted",
        "invalid_arguments",
        "msg_too_long",
        "no_text",
    }
)

# What a reply says when it cannot be a reply (its thread has no parent in this channel).
NO_PARENT = {
    "failed": "_The request's message could not be posted here; this is what became of it._",
    "moved": "_The request's message is in the group's previous channel; "
    "this is what became of it._",
    "none": "_The request's message was not posted by this app; this is what became of it._",
}
WAITING = "waiting for the request's Slack message to be posted first"


def post_url() -> str:
    return str(settings.SLACK_API_URL).rstrip("/") + "/chat.postMessage"


def _parent(delivery: NotificationDelivery, group: ReviewerGroup) -> NotificationDelivery | None:
    """The first app message this group was sent about the request (its request's message,
    or for a fallback group the escalation): the thread the others reply in."""
    return (
        NotificationDelivery.objects.filter(
            group=group,
            channel=Channel.SLACK_APP,
            event__occurrence_id=delivery.body.get("occurrence_id"),
        )
        .exclude(pk=delivery.pk)
        .exclude(event__kind=NotificationEvent.Kind.DECIDED)
        .order_by("created_at")
        .only("pk", "state", "slack_ts", "slack_channel", "created_at")
        .first()
    )


def _thread(delivery: NotificationDelivery, group: ReviewerGroup) -> tuple[str, str] | Sent:
    """``(thread_ts, "")`` to reply in the request's thread, ``("", note)`` to post a plain
    message saying why it is not a reply, or a ``Sent`` retry while the parent is still
    being posted (until this delivery's last attempt)."""
    parent = _parent(delivery, group)
    if parent is None or parent.created_at > delivery.created_at:
        first = delivery.body.get("event") != NotificationEvent.Kind.DECIDED
        return "", "" if first else NO_PARENT["none"]  # the escalation opens its thread
    if parent.slack_ts:
        if parent.slack_channel != group.slack_channel_id:
            return "", NO_PARENT["moved"]
        return parent.slack_ts, ""
    pending = parent.state == NotificationDelivery.State.PENDING
    if pending and delivery.attempts + 1 < settings.NOTIFY_MAX_ATTEMPTS:
        return Sent(error=WAITING)  # retried with backoff; its last attempt posts anyway
    return "", NO_PARENT["failed"]


def _answer(response: httpx.Response) -> tuple[Sent, dict[str, Any]]:
    code = response.status_code
    if code == 429:
        after = response.headers.get("Retry-After", "")
        return Sent(code, f"HTTP 429: rate limited (Retry-After {after or '?'} s)"), {}
    if not 200 <= code < 300:
        return Sent(code, f"HTTP {code}"), {}
    try:
        answer = json.loads(response.content)
    except ValueError:
        return Sent(code, "Slack answered something other than JSON"), {}
    if not isinstance(answer, dict):
        return Sent(code, "Slack answered something other than a JSON object"), {}
    if answer.get("ok") is not True:
        error = str(answer.get("error") or "unknown")[:100]
        return Sent(code, f"Slack: {error}", give_up=error in GIVE_UP), {}
    return Sent(code), answer


@sensitive_variables("token", "headers")
def post(delivery: NotificationDelivery, text: str) -> Sent:
    """One ``chat.postMessage`` of ``text`` for ``delivery`` (outside any transaction); the
    message's ``ts`` and channel recorded on the delivery when Slack took it."""
    group = delivery.group
    token = group_secret_decrypt(group.slack_bot_token_encrypted) if group else ""
    if group is None or not token or not group.slack_channel_id:
        return Sent(error="the group has no Slack app now", give_up=True)
    payload: dict[str, Any] = {"channel": group.slack_channel_id, "text": text}
    if delivery.body.get("event") != NotificationEvent.Kind.REQUESTED:
        thread = _thread(delivery, group)
        if isinstance(thread, Sent):
            return thread
        thread_ts, note = thread
        if thread_ts:
            payload["thread_ts"] = thread_ts
        elif note:
            payload["text"] = f"{note}\n{text}"
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "Authorization": f"Bearer {token}",
    }
    try:
        # Public addresses only unless the operator allows private ones, as for callbacks.
        with outbound_client(public_only=not settings.CALLBACK_ALLOW_PRIVATE_HOSTS) as client:
            response = client.post(post_url(), content=json.dumps(payload), headers=headers)
    except httpx.HTTPError as exc:
        return Sent(error=f"{type(exc).__name__}: {exc}"[:500])
    sent, answer = _answer(response)
    if not sent.error:
        ts, channel = str(answer.get("ts") or "")[:32], str(answer.get("channel") or "")[:32]
        NotificationDelivery.objects.filter(pk=delivery.pk).update(
            slack_ts=ts, slack_channel=channel or group.slack_channel_id
        )
        delivery.slack_ts, delivery.slack_channel = ts, channel or group.slack_channel_id
    return sent
