"""No permanent deadlock: a queue item nobody took for longer than its tenant allows is
escalated once, by a signed webhook to the tenant's URL (and an email if one is set), with
the link to its occurrence. An item an operator is on ("I'm on it", a live take) is not
escalated meanwhile; once the take lapses or is let go, it is. Escalation only tells
people; it never acts."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import httpx
import structlog
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from approvals.audit.record import audit_record
from approvals.outbound.client import outbound_client
from approvals.vocabulary import AuditKind, EventDecision
from reconciliation.adapters.webhook import signed_headers
from reconciliation.credentials import decrypt
from reconciliation.models import Escalation, EscalationPolicy
from reconciliation.selectors.queue import Owner, QueueItem, queue_items

log = structlog.get_logger("reconciliation")

# An escalation whose webhook failed is tried again on later runs, this many times in all.
MAX_ATTEMPTS = 5


def _payload(item: QueueItem, now_ts: float) -> dict[str, object]:
    link = settings.CONSOLE_BASE_URL.rstrip("/") + reverse(
        "reconciliation:timeline", args=[item.occurrence.pk]
    )
    return {
        "type": "operations.escalated",
        "tenant": item.occurrence.tenant.slug,
        "reason": item.reason,
        "reason_label": item.reason_label,
        "occurrence_id": str(item.occurrence.pk),
        "tool": item.occurrence.tool.name,
        "since": item.since.isoformat(),
        "age_seconds": int(now_ts - item.since.timestamp()),
        "link": link,
    }


def _deliver(policy: EscalationPolicy, escalation: Escalation, body: bytes) -> tuple[bool, str]:
    sent: list[str] = []
    ok = True
    if policy.webhook_url:
        secret = decrypt(policy.secret_encrypted) if policy.secret_encrypted else ""
        message_id = f"escalation-{escalation.pk}"
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": message_id,
            **signed_headers(secret=secret, message_id=message_id, body=body),
        }
        try:
            # An address the operator did not allow is refused where the client connects,
            # as a callback's is (the URL is typed by a tenant's admin).
            public_only = not settings.CALLBACK_ALLOW_PRIVATE_HOSTS
            with outbound_client(public_only=public_only) as client:
                response = client.post(policy.webhook_url, content=body, headers=headers)
            ok = response.is_success
            sent.append(f"webhook {response.status_code}")
        except httpx.HTTPError as exc:
            ok = False
            sent.append(f"webhook failed: {type(exc).__name__}")
    if policy.email:
        payload = json.loads(body)
        send_mail(
            subject=f"[approval console] {payload['reason_label']}: {payload['tool']}",
            message=(
                f"{payload['reason_label']} for {payload['age_seconds'] // 60} minutes, "
                f"tenant {payload['tenant']}.\n\nOpen it: {payload['link']}\n\n"
                "Nothing was done automatically."
            ),
            from_email=None,
            recipient_list=[policy.email],
            fail_silently=True,
        )
        sent.append(f"email to {policy.email}")
    return ok, ", ".join(sent)


def escalations_run() -> int:
    """Escalate every queue item past its tenant's threshold that was not escalated yet,
    and try again the ones whose delivery failed. Returns how many were delivered."""
    now = timezone.now()
    delivered = 0
    for policy in EscalationPolicy.objects.select_related("tenant"):
        threshold = now - timedelta(minutes=policy.after_minutes)
        overdue = [
            item
            for item in queue_items(
                tenant_ids=[policy.tenant_id], now=now, owner=Owner(Owner.UNOWNED)
            )
            if item.since <= threshold
        ]
        for item in overdue:
            try:
                with transaction.atomic():
                    escalation = Escalation.objects.create(
                        tenant_id=policy.tenant_id,
                        item_key=item.key,
                        reason=item.reason,
                        occurrence_id=item.occurrence.pk,
                    )
            except IntegrityError:
                escalation = Escalation.objects.get(tenant_id=policy.tenant_id, item_key=item.key)
                if escalation.delivered or escalation.attempts >= MAX_ATTEMPTS:
                    continue
            # The unique row is the claim on this escalation: only the run that moves its
            # attempt count sends it.
            claimed = Escalation.objects.filter(
                pk=escalation.pk, delivered=False, attempts=escalation.attempts
            ).update(attempts=escalation.attempts + 1)
            if not claimed:
                continue
            body = json.dumps(_payload(item, time.time()), sort_keys=True).encode()
            ok, detail = _deliver(policy, escalation, body)
            Escalation.objects.filter(pk=escalation.pk).update(delivered=ok, detail=detail)
            audit_record(
                kind=AuditKind.OPERATIONS_ESCALATED,
                tenant=policy.tenant_id,
                occurrence=item.occurrence.pk,
                actor="escalation",
                decision=EventDecision.DELIVERED if ok else EventDecision.FAILED,
                reason_code=item.reason,
                command_id=item.command.pk if item.command else None,
                data={"item": item.key, "delivery": detail, "attempt": escalation.attempts + 1},
            )
            delivered += int(ok)
            log.info("operations.escalated", item=item.key, ok=ok, detail=detail)
    return delivered
