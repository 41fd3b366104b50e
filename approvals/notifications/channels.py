"""Sending one delivery on its channel: e-mail (Django's e-mail framework), Slack (an
incoming webhook, or a Slack app whose replies are threaded: ``slack_app``), a generic
webhook (signed with Standard Webhooks, as callbacks are)."""

from __future__ import annotations

import json
import smtplib
import time
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string

from approvals.models import Channel, NotificationDelivery
from approvals.notifications import mailer, slack_app
from approvals.notifications.content import headline
from approvals.outbound import signing
from approvals.outbound.client import outbound_client
from approvals.outbound.outbox import Sent
from approvals.routing.changes import group_secret_decrypt

DIGEST = "digest"


def _post(url: str, body: bytes, headers: dict[str, str]) -> Sent:
    try:
        # Public addresses only unless the operator allows private ones, as for callbacks.
        with outbound_client(public_only=not settings.CALLBACK_ALLOW_PRIVATE_HOSTS) as client:
            response = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return Sent(error=f"{type(exc).__name__}: {exc}"[:500])
    code = response.status_code
    return Sent(code, "" if 200 <= code < 300 else f"HTTP {code}")


def _email(delivery: NotificationDelivery) -> Sent:
    user = delivery.user
    if user is None or not user.email or not user.is_active:
        return Sent(error="the reviewer has no e-mail address now", give_up=True)
    body = delivery.body
    items = body.get("items") if body.get("event") == DIGEST else [body]
    subject = (
        f"{len(items)} request(s) for your review"
        if body.get("event") == DIGEST
        else headline(body)
    )
    context = {"items": items, "digest": body.get("event") == DIGEST, "user": user}
    context["headlines"] = [headline(item) for item in items]
    mail = EmailMultiAlternatives(
        subject=f"[Approval console] {subject}",
        body=render_to_string("notifications/email.txt", context),
        to=[user.email],
    )
    mail.attach_alternative(render_to_string("notifications/email.html", context), "text/html")
    try:
        mailer.send(mail)
    except (smtplib.SMTPException, OSError) as exc:
        return Sent(error=f"{type(exc).__name__}: {exc}"[:500])
    return Sent()


def slack_text(body: dict[str, Any]) -> str:
    """The Slack message: summary, amount, requester, the digest's first 12 characters and
    the link (Slack's mrkdwn link syntax; the agent's words escaped for it)."""

    def esc(text: str) -> str:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    lines = [f"*{esc(headline(body))}*"]
    requester = body.get("requester") or {}  # absent from bodies written before the marks
    lines.append(
        f"Requested by {esc(requester.get('shown') or body.get('requested_by') or 'the agent')}"
    )
    if requester.get("look_alike"):
        lines.append(f":warning: *Look-alike requester:* {esc(requester.get('note', ''))}")
    elif requester.get("note"):
        lines.append(f"_Requester: {esc(requester['note'])}_")
    if body.get("amount"):
        lines.append(f"Amount: {esc(body['amount'])}")
    if body.get("decided_by"):  # absent from bodies written before it was recorded
        lines.append(f"Decided by {esc(body['decided_by'])}")
    if body.get("rejection_reason"):
        lines.append(f"Reason for rejecting: {esc(body['rejection_reason'])}")
    lines.append(f"Digest: `{body.get('digest_prefix', '')}`")
    lines.append(f"<{body['link']}|Open the review page>")
    return "\n".join(lines)


def _slack(delivery: NotificationDelivery) -> Sent:
    group = delivery.group
    url = group_secret_decrypt(group.slack_webhook_encrypted) if group else ""
    if not url:
        return Sent(error="the group has no Slack webhook now", give_up=True)
    payload = {"text": slack_text(delivery.body)}
    return _post(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})


def _webhook(delivery: NotificationDelivery) -> Sent:
    group = delivery.group
    secret = group_secret_decrypt(group.webhook_secret_encrypted) if group else ""
    if group is None or not group.webhook_url or not secret:
        return Sent(
            error="the group has no webhook (or its secret no longer decrypts)", give_up=True
        )
    payload = {
        "type": f"review.{delivery.body.get('event', '')}",
        "delivery_id": str(delivery.pk),
        "group": group.name,
        "data": delivery.body,
    }
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "approval-console-notifications/1",
        **signing.signed_headers(
            secret=secret, message_id=str(delivery.pk), timestamp=int(time.time()), body=body
        ),
    }
    return _post(group.webhook_url, body, headers)


def send(delivery: NotificationDelivery) -> Sent:
    """One send of ``delivery`` on its channel (outside any transaction)."""
    if delivery.channel == Channel.EMAIL:
        return _email(delivery)
    if delivery.channel == Channel.SLACK:
        return _slack(delivery)
    if delivery.channel == Channel.SLACK_APP:
        return slack_app.post(delivery, slack_text(delivery.body))
    if delivery.channel == Channel.WEBHOOK:
        return _webhook(delivery)
    return Sent()  # the console's own: nothing to send
