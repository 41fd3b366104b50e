"""Which addresses the console may call when the operator allows only public ones
(``CALLBACK_ALLOW_PRIVATE_HOSTS`` off).

A host is read as the resolver reads it, not as a URL parser does: ``127.1``,
``2130706433``, ``0x7f000001``, ``0177.0.0.1`` and ``0`` are all IPv4 addresses to
``getaddrinfo`` (glibc's ``inet_aton`` forms), ``localhost.`` is ``localhost``, and a name
is whatever it resolves to. Registering a URL refuses what is private then
(``host_is_private``); the client (``approvals.outbound.client``) resolves the name again
when it connects and refuses there too, so a name that resolves to a public address at
registration and to an internal one later (DNS rebinding) still reaches nothing inside.
"""

from __future__ import annotations

import ipaddress
import socket

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Names the resolver may answer from /etc/hosts or itself without asking DNS.
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def is_public(address: Address) -> bool:
    """Globally routable unicast: not loopback, private, link-local (the cloud metadata
    address among them), shared, reserved, unspecified or multicast. An IPv4-mapped IPv6
    address is judged by its IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def resolve(host: str, port: int | None = None) -> list[Address]:
    """Every address ``host`` stands for, as the operating system's resolver answers
    (literals in every form it reads included); raises ``OSError`` when it answers none.
    The one place names are resolved, so that the tests can stand in for DNS."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[Address] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    return found


def literal(host: str) -> Address | None:
    """The address a host names by itself, in any form the resolver reads as a number;
    None for a name (or for something no resolver reads at all)."""
    host = host.removeprefix("[").removesuffix("]")
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError, ValueError):
        return None
    return ipaddress.ip_address(str(infos[0][4][0]).split("%", 1)[0])


def host_is_private(host: str) -> bool:
    """Whether ``host`` names, or now resolves to, an address that is not public. A name
    that does not resolve now is not refused here: the client checks it when it calls."""
    name = host.lower().rstrip(".")
    if name in LOCAL_NAMES or name.endswith(".localhost") or not name:
        return True
    address = literal(name)
    if address is not None:
        return not is_public(address)
    try:
        addresses = resolve(name)
    except (OSError, UnicodeError, ValueError):
        return False
    return not all(is_public(address) for address in addresses)
