"""Each reviewer's choice per channel (every request, a digest every N minutes, nothing)
and their quiet hours, read in their own time zone."""

from __future__ import annotations

from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from django.db import transaction

from approvals.errors import InputError
from approvals.models import Channel, NotificationPreference

# The channels a reviewer chooses for themself; Slack and webhooks are a group's.
PERSONAL_CHANNELS = (Channel.EMAIL, Channel.CONSOLE)
MAX_DIGEST_MINUTES = 7 * 24 * 60


def preferences_of(user_ids: list[int]) -> dict[tuple[int, str], NotificationPreference]:
    """The stored preferences of these users by (user, channel); a missing one means the
    default: every request, no quiet hours."""
    return {
        (p.user_id, p.channel): p
        for p in NotificationPreference.objects.filter(
            user_id__in=user_ids, channel__in=PERSONAL_CHANNELS
        )
    }


def default_preference(user_id: int, channel: str) -> NotificationPreference:
    return NotificationPreference(user_id=user_id, channel=channel)


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def quiet_until(pref: NotificationPreference, now: datetime) -> datetime | None:
    """The end of the quiet hours ``now`` falls in (an aware instant), or None when the
    reviewer is not in quiet hours. 22:00-07:00 spans midnight; start == end is none."""
    start, end = pref.quiet_start, pref.quiet_end
    if start is None or end is None or start == end:
        return None
    local = now.astimezone(_zone(pref.time_zone))
    clock = local.time().replace(tzinfo=None)
    if start < end:
        quiet = start <= clock < end
        day = local.date()
    else:  # across midnight
        quiet = clock >= start or clock < end
        day = local.date() + timedelta(days=1) if clock >= start else local.date()
    if not quiet:
        return None
    # Built as a local wall time then normalised (a DST gap moves it by the gap, no more).
    until = datetime.combine(day, end, tzinfo=local.tzinfo)
    return until.astimezone(ZoneInfo("UTC"))


def _time(value: str, field: str) -> time | None:
    value = (value or "").strip()
    if not value:
        return None
    try:
        return time.fromisoformat(value)
    except ValueError:
        raise InputError("invalid_time", "Write a time as HH:MM, e.g. 22:00.", field) from None


def preference_save(
    *,
    user_id: int,
    channel: str,
    mode: str,
    digest_minutes: int = 60,
    time_zone: str = "UTC",
    quiet_start: str = "",
    quiet_end: str = "",
) -> NotificationPreference:
    """Store the reviewer's choice for one personal channel."""
    if channel not in PERSONAL_CHANNELS:
        raise InputError("invalid_channel", "Choose e-mail or the console.", "channel")
    if mode not in NotificationPreference.Mode.values:
        raise InputError("invalid_mode", "Choose every request, a digest or nothing.", "mode")
    if channel == Channel.CONSOLE and mode == NotificationPreference.Mode.DIGEST:
        raise InputError("invalid_mode", "The console counts each request; no digest.", "mode")
    if not 1 <= digest_minutes <= MAX_DIGEST_MINUTES:
        raise InputError(
            "invalid_digest", "A digest comes every 1 to 10080 minutes.", "digest_minutes"
        )
    if time_zone not in available_timezones():
        raise InputError(
            "invalid_time_zone", "Choose a time zone such as Europe/Paris.", "time_zone"
        )
    start, end = _time(quiet_start, "quiet_start"), _time(quiet_end, "quiet_end")
    if (start is None) != (end is None):
        raise InputError("invalid_time", "Give the quiet hours a start and an end.", "quiet_end")
    with transaction.atomic():
        pref, _ = NotificationPreference.objects.select_for_update().get_or_create(
            user_id=user_id, channel=channel
        )
        pref.mode = mode
        pref.digest_minutes = digest_minutes
        pref.time_zone = time_zone
        pref.quiet_start, pref.quiet_end = start, end
        pref.save()
    return pref
