"""A reviewer's notifications page (``/account/notifications/``): how each personal
channel tells them (every request, a digest every N minutes, nothing), their quiet hours
in their time zone, and what the console told them lately (the header's unread count)."""

from __future__ import annotations

from typing import Any
from zoneinfo import available_timezones

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import InputError
from approvals.models import Channel, NotificationPreference
from approvals.notifications.preferences import PERSONAL_CHANNELS, preference_save
from approvals.notifications.selectors import notifications_read, recent
from approvals.web.selectors.access import console_access
from approvals.web.shell import chrome, console_login_required

TEMPLATE = "approvals/notifications.html"


def _user_id(request: HttpRequest) -> int:
    # Signed in (console_login_required): the user has a primary key.
    return int(request.user.pk or 0)


class PreferenceForm(forms.Form):
    channel = forms.ChoiceField(choices=[(c.value, c.label) for c in PERSONAL_CHANNELS])
    mode = forms.ChoiceField(choices=NotificationPreference.Mode.choices)
    digest_minutes = forms.IntegerField(required=False, min_value=1, max_value=10080)
    time_zone = forms.CharField(required=False, max_length=64)
    quiet_start = forms.CharField(required=False, max_length=8)
    quiet_end = forms.CharField(required=False, max_length=8)


def _render(
    request: HttpRequest, *, errors: list[str] | None = None, status: int = 200
) -> HttpResponse:
    access = console_access(request.user)
    stored = {
        p.channel: p for p in NotificationPreference.objects.filter(user_id=_user_id(request))
    }
    channels = [
        (channel, stored.get(channel) or NotificationPreference(channel=channel))
        for channel in PERSONAL_CHANNELS
    ]
    context: dict[str, Any] = {
        **chrome(request, access),
        "channels": channels,
        "modes": NotificationPreference.Mode.choices,
        "zones": sorted(available_timezones()),
        "recent": recent(request.user.pk),
        "has_email": bool(getattr(request.user, "email", "")),
        "errors": errors or [],
        "console_channel": Channel.CONSOLE,
        "digest_mode": NotificationPreference.Mode.DIGEST,
    }
    return render(request, TEMPLATE, context, status=status)


@require_GET
@console_login_required
def notifications(request: HttpRequest) -> HttpResponse:
    return _render(request)


@require_POST
@console_login_required
def notifications_save(request: HttpRequest) -> HttpResponse:
    form = PreferenceForm(request.POST)
    if not form.is_valid():
        errors = [f"{k}: {' '.join(str(e) for e in v)}" for k, v in form.errors.items()]
        return _render(request, errors=errors, status=422)
    data = form.cleaned_data
    try:
        preference_save(
            user_id=_user_id(request),
            channel=data["channel"],
            mode=data["mode"],
            digest_minutes=data["digest_minutes"] or 60,
            time_zone=data["time_zone"] or "UTC",
            quiet_start=data["quiet_start"] or "",
            quiet_end=data["quiet_end"] or "",
        )
    except InputError as exc:
        return _render(request, errors=[exc.message], status=422)
    messages.success(request, f"Saved: {Channel(data['channel']).label}.")
    return redirect("approvals:notifications")


@require_POST
@console_login_required
def notifications_mark_read(request: HttpRequest) -> HttpResponse:
    notifications_read(user_id=request.user.pk)
    return redirect("approvals:notifications")
