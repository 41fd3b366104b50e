"""Issue 23: callbacks reach no internal host unless the operator allows it. An address is
read as the resolver reads it, a name is resolved again when the worker connects (no DNS
rebinding window), and a URL nobody can call is a 422, never a 500."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from approvals.callbacks.delivery import deliver
from approvals.models import CallbackAttempt, CallbackDelivery, RuntimeCallback
from approvals.outbound import addresses
from tests.conftest import Runtime, approve, make_runtime

PUBLIC = ipaddress.ip_address("93.184.216.34")
# The fuzzer's pair of surrogates, which JSON reads as one character beyond U+FFFF.
ASTRAL = "\udabe\udf3f".encode("utf-16", "surrogatepass").decode("utf-16")
LOOPBACK = ipaddress.ip_address("127.0.0.1")


@pytest.fixture(autouse=True)
def defaults(settings: Any) -> None:
    """A deployment's defaults, but plain http (the receivers here speak no TLS)."""
    settings.CALLBACK_ALLOW_HTTP = True
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = False
    settings.CALLBACK_MAX_ATTEMPTS = 1


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """A stand-in for DNS: names in it resolve to what it says, anything else as before."""
    answers: dict[str, list[Any]] = {}
    real = addresses.resolve

    def resolve(host: str, port: int | None = None) -> list[Any]:
        return list(answers[host]) if host in answers else real(host, port)

    monkeypatch.setattr(addresses, "resolve", resolve)
    return answers


class Listener:
    """A real loopback server that records whether anything connected to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


def register(runtime: Runtime, url: str) -> Any:
    return runtime.client.put(
        "/api/v1/callback", json.dumps({"url": url}), content_type="application/json"
    )


@pytest.mark.parametrize(
    "host",
    [
        "127.1",
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "0x7f.1",
        "0",
        "localhost.",
        "LOCALHOST",
        "api.localhost",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[::]",
        "169.254.169.254",
        "100.64.0.1",
        "224.0.0.1",
    ],
)
def test_every_spelling_of_an_internal_address_is_refused(runtime: Runtime, host: str) -> None:
    response = register(runtime, f"https://{host}:8443/hook")

    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] == "private_host"
    assert not RuntimeCallback.objects.exists()


def test_a_name_that_resolves_to_an_internal_address_is_refused(
    runtime: Runtime, dns: dict[str, list[Any]]
) -> None:
    dns["intranet.example.com"] = [PUBLIC, LOOPBACK]  # one internal answer is enough

    response = register(runtime, "https://intranet.example.com/hook")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "private_host"


def test_a_name_that_resolves_to_public_addresses_is_accepted(
    runtime: Runtime, dns: dict[str, list[Any]]
) -> None:
    dns["agents.example.com"] = [PUBLIC]

    assert register(runtime, "https://agents.example.com/hook").status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        f"http://[{ASTRAL}:k{ASTRAL}",  # what the fuzzer sent: a 500 before
        f"http://[{ASTRAL}::1]:k/",
        "http://[::1",
        "https://agents.example.com:99999/hook",
        "https://agents.example.com:0/hook",
        "https://agents.example.com:k/hook",
        f"https://agents.exa{ASTRAL}mple.com:70000/hook",
    ],
)
def test_a_url_nobody_can_call_is_a_422(runtime: Runtime, settings: Any, url: str) -> None:
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True

    response = register(runtime, url)

    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] == "invalid_url"
    assert not RuntimeCallback.objects.exists()


def delivery_to(runtime: Runtime, reviewer: Any) -> CallbackDelivery:
    approve(runtime.propose().json()["occurrence_id"], reviewer)
    return CallbackDelivery.objects.get(callback__runtime_key=runtime.key)


def test_a_name_rebound_to_an_internal_address_is_not_connected_to(
    runtime: Runtime, reviewer: Any, dns: dict[str, list[Any]], listener: Listener
) -> None:
    """Public when registered, loopback when the worker connects: refused there, and the
    internal server never sees a connection."""
    dns["rebind.example.com"] = [PUBLIC]
    url = f"http://rebind.example.com:{listener.port}/hook"
    assert register(runtime, url).status_code == 200
    delivery = delivery_to(runtime, reviewer)
    dns["rebind.example.com"] = [LOOPBACK]

    assert deliver(str(delivery.pk)).outcome == "failed"

    assert listener.connections == 0
    (attempt,) = CallbackAttempt.objects.all()
    assert attempt.status_code is None
    assert "ConnectError" in attempt.error and "not a public address" in attempt.error


def test_the_counts_say_nothing_about_an_internal_target(
    runtime: Runtime, tenant: Any, reviewer: Any, dns: dict[str, list[Any]], listener: Listener
) -> None:
    """One name rebound to a live internal server, one to a port nobody listens on: the
    caller reads the same counts for both, and nothing inside was reached."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    other = make_runtime(tenant, "other-runtime")
    dns["live.example.com"] = dns["dead.example.com"] = [PUBLIC]
    assert register(runtime, f"http://live.example.com:{listener.port}/").status_code == 200
    assert register(other, f"http://dead.example.com:{closed_port}/").status_code == 200
    deliveries = [delivery_to(runtime, reviewer), delivery_to(other, reviewer)]
    dns["live.example.com"] = dns["dead.example.com"] = [LOOPBACK]

    for delivery in deliveries:
        deliver(str(delivery.pk))

    counts = [r.get("/api/v1/callback").json()["deliveries"] for r in (runtime, other)]
    assert counts[0] == counts[1] == {"pending": 0, "delivered": 0, "failed": 1}
    assert listener.connections == 0


def test_an_operator_who_allows_private_hosts_gets_them_called(
    runtime: Runtime, reviewer: Any, settings: Any, listener: Listener
) -> None:
    settings.CALLBACK_ALLOW_PRIVATE_HOSTS = True
    assert register(runtime, f"http://127.0.0.1:{listener.port}/hook").status_code == 200

    assert deliver(str(delivery_to(runtime, reviewer).pk)).outcome == "delivered"
    assert listener.connections == 1
