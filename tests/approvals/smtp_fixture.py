"""A real SMTP server in-process (aiosmtpd) that keeps what it receives, and settings that
send the console's e-mail to it. Bind it in a test module by assignment::

    from tests.approvals import smtp_fixture

    smtp = smtp_fixture.smtp
"""

from __future__ import annotations

import email
import email.policy
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller


@dataclass
class Mailbox:
    """What the server received, parsed; its address for the settings."""

    host: str = "127.0.0.1"
    port: int = 0
    messages: list[EmailMessage] = field(default_factory=list)
    # The client's address of each message's connection: one per connection opened.
    peers: list[tuple[str, int]] = field(default_factory=list)
    controller: Controller | None = None

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(parsed)  # type: ignore[arg-type]
        self.peers.append(session.peer)
        return "250 OK"

    def start(self) -> None:
        self.controller = Controller(self, hostname=self.host, port=self.port)
        self.controller.start()

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    def restart(self) -> None:
        """Stop the server (its open connections dropped) and start it on the same port."""
        self.stop()
        self.start()

    def to(self, address: str) -> list[EmailMessage]:
        return [m for m in self.messages if address in str(m["To"])]

    def wait_for(self, count: int, timeout: float = 60.0) -> list[EmailMessage]:
        start = time.monotonic()
        while len(self.messages) < count:
            if time.monotonic() - start > timeout:
                pytest.fail(f"timed out waiting for {count} e-mails ({len(self.messages)} came)")
            time.sleep(0.05)
        return self.messages


def parts(message: EmailMessage) -> tuple[str, str]:
    """The plain text and the HTML of a message."""
    text = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    assert text is not None and html is not None, "both a plain text and an HTML part"
    return str(text.get_content()), str(html.get_content())


@pytest.fixture
def smtp(settings: Any) -> Iterator[Mailbox]:
    box = Mailbox()
    # aiosmtpd checks its start by connecting to the port it was given: a free one, then.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        box.port = probe.getsockname()[1]
    box.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = box.host, box.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    try:
        yield box
    finally:
        box.stop()
