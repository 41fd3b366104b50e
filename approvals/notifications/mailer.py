"""Sending e-mail on one SMTP connection per worker process (per thread), opened on the
first message and reused for the next ones instead of a connect, ``EHLO`` and ``QUIT`` per
message (Django's backend: ``get_connection()`` opened once, ``send_messages`` on it).

A connection the server dropped while it sat idle (a restart, an idle timeout) fails at the
next message's ``MAIL FROM``, before the message is handed over: it is reopened once and the
message sent on the new one. A failure on a connection just opened is the attempt's error,
as before. Any other failure closes the connection, so that the next message starts on a
clean one. Backends other than SMTP (the console's file backend for the demo, locmem in
tests) get a connection per message as Django's ``send()`` gives them.
"""

from __future__ import annotations

import smtplib
import threading
from typing import Any

import structlog
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend
from django.utils.module_loading import import_string

log = structlog.get_logger("approvals.notifications")

# What a server that went away looks like on a reused connection.
_DROPPED = (smtplib.SMTPServerDisconnected, ConnectionError)

_held = threading.local()


def _settings_key() -> tuple[Any, ...]:
    """A change of the e-mail settings (tests point them at a server of their own) opens
    a new connection."""
    return (
        settings.EMAIL_BACKEND,
        settings.EMAIL_HOST,
        settings.EMAIL_PORT,
        settings.EMAIL_HOST_USER,
        settings.EMAIL_HOST_PASSWORD,
        settings.EMAIL_USE_TLS,
        settings.EMAIL_USE_SSL,
        settings.EMAIL_TIMEOUT,
    )


def close() -> None:
    """Close this thread's connection, if any (a worker process shutting down)."""
    connection = getattr(_held, "connection", None)
    _held.connection = None
    if connection is not None:
        try:
            connection.close()
        except Exception:  # closing a dead connection: nothing left to do with it
            log.debug("notification.smtp_close_failed")


def _open() -> SMTPBackend:
    close()
    connection = get_connection(fail_silently=False)
    connection.open()
    _held.connection, _held.key = connection, _settings_key()
    return connection  # type: ignore[no-any-return]


def send(mail: EmailMessage) -> None:
    """Send one message; raises what Django's backend raises (``SMTPException``,
    ``OSError``)."""
    if not issubclass(import_string(settings.EMAIL_BACKEND), SMTPBackend):
        mail.send()
        return
    held = getattr(_held, "connection", None)
    reused = held is not None and _held.key == _settings_key()
    connection = held if held is not None and reused else _open()
    try:
        connection.send_messages([mail])
    except _DROPPED:
        close()
        if not reused:
            raise
        log.info("notification.smtp_reconnect")
        connection = _open()
        try:
            connection.send_messages([mail])
        except BaseException:
            close()
            raise
    except BaseException:
        close()
        raise
