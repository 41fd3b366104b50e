"""``/_demo/outbox`` (DEBUG only): the notifications the console sent, as a local catcher
received them, so that a newcomer running ``bin/demo`` sees them without an SMTP server or
a Slack workspace.

``bin/demo`` sends e-mail with Django's file backend into ``EMAIL_FILE_PATH``, and seeds
the demo's reviewer groups with Slack and webhook URLs that point back at
``/_demo/outbox/catch/<channel>``, which appends what it receives to a file in the same
directory. The demo's Slack app posts to ``/_demo/outbox/slack-api/chat.postMessage``
(``SLACK_API_URL``), which answers as Slack's Web API does (``ok`` and a ``ts``), so its
replies are threaded as they would be in Slack. The page shows all of it, and every
delivery's attempts from the database. With DEBUG off all answer 404: nothing here exists
on a deployment."""

from __future__ import annotations

import email
import email.policy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from approvals.models import NotificationDelivery
from approvals.web.selectors.access import console_access
from approvals.web.shell import chrome, console_login_required

CAUGHT = "caught.jsonl"
SHOWN = 50
# A caught body is kept up to this size.
CATCH_LIMIT = 64 * 1024


def _require_debug() -> Path:
    if not settings.DEBUG:
        raise Http404("Only under DEBUG (bin/demo).")
    return Path(settings.EMAIL_FILE_PATH)


@dataclass(frozen=True)
class Mail:
    at: str
    to: str
    subject: str
    text: str


def _mails(folder: Path) -> list[Mail]:
    found = []
    files = sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in files[:SHOWN]:
        # The file backend appends each message followed by a line of 79 dashes.
        for raw in reversed(path.read_bytes().split(b"\n" + b"-" * 79 + b"\n")):
            if not raw.strip():
                continue
            message = email.message_from_bytes(raw.strip(), policy=email.policy.default)
            body = message.get_body(preferencelist=("plain",))  # type: ignore[attr-defined]
            found.append(
                Mail(
                    at=str(message.get("Date", "")),
                    to=str(message.get("To", "")),
                    subject=str(message.get("Subject", "")),
                    text=str(body.get_content()) if body is not None else "",
                )
            )
    return found[:SHOWN]


def _caught(folder: Path) -> list[dict[str, Any]]:
    path = folder / CAUGHT
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-SHOWN:]
    return [json.loads(line) for line in reversed(lines) if line.strip()]


@require_GET
@console_login_required
def demo_outbox(request: HttpRequest) -> HttpResponse:
    folder = _require_debug()
    access = console_access(request.user)
    deliveries = (
        NotificationDelivery.objects.filter(tenant_id__in=access.tenant_ids)
        .select_related("user", "group")
        .order_by("-created_at")[:SHOWN]
    )
    context = {
        **chrome(request, access),
        "mails": _mails(folder) if folder.exists() else [],
        "caught": _caught(folder) if folder.exists() else [],
        "deliveries": deliveries,
        "folder": folder,
    }
    return render(request, "approvals/demo_outbox.html", context)


@csrf_exempt  # a receiver, as Slack's and a webhook's would be: no browser posts here
@require_POST
def demo_outbox_catch(request: HttpRequest, channel: str) -> HttpResponse:
    folder = _require_debug()
    body = request.body[:CATCH_LIMIT].decode("utf-8", errors="replace")
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        parsed = body
    signed = "webhook-signature" in request.headers
    entry = {
        "at": timezone.now().isoformat(),
        "channel": channel[:20],
        "signed": signed,
        "text": parsed.get("text") if isinstance(parsed, dict) else None,
        "body": parsed,
    }
    _keep(folder, entry)
    return HttpResponse(status=204)


def _keep(folder: Path, entry: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / CAUGHT).open("a", encoding="utf-8") as caught:
        caught.write(json.dumps(entry) + "\n")


@csrf_exempt  # plays Slack's Web API, which a browser never posts to
@require_POST
def demo_slack_api(request: HttpRequest) -> HttpResponse:
    """``chat.postMessage`` as Slack answers it: ``ok`` with the message's ``ts`` (a bot
    token wanted, never kept), so that the demo's Slack app threads its replies."""
    folder = _require_debug()
    if not request.headers.get("Authorization", "").startswith("Bearer xoxb-"):
        return JsonResponse({"ok": False, "error": "not_authed"})
    try:
        payload = json.loads(request.body[:CATCH_LIMIT])
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or not payload.get("channel") or not payload.get("text"):
        return JsonResponse({"ok": False, "error": "invalid_arguments"})
    ts = f"{time.time():.6f}"
    _keep(
        folder,
        {
            "at": timezone.now().isoformat(),
            "channel": "slack app",
            "signed": False,
            "text": str(payload["text"]),
            "body": {
                "channel": str(payload["channel"])[:32],
                "ts": ts,
                "thread_ts": str(payload.get("thread_ts") or "")[:32],
            },
        },
    )
    return JsonResponse({"ok": True, "channel": payload["channel"], "ts": ts})
