"""Every task celery beat is told to send exists: a schedule naming a task nobody
registered only makes a worker log "unregistered task" once a minute, and what it was
meant to do never happens (the expiry sweep went unrun that way)."""

from __future__ import annotations

from django.conf import settings

from config.celery import app


def test_every_scheduled_task_is_registered() -> None:
    app.loader.import_default_modules()
    scheduled = {name: entry["task"] for name, entry in settings.CELERY_BEAT_SCHEDULE.items()}
    missing = {name: task for name, task in scheduled.items() if task not in app.tasks}
    assert not missing, f"scheduled but not registered: {missing}"


def test_the_expiry_sweep_runs_every_minute_by_default() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["expire-what-the-clock-expired"]
    assert entry["task"] == "approvals.tasks.approvals_expire"
    assert float(entry["schedule"]) == 60.0  # type: ignore[arg-type]
