"""Reading the settings from the environment: typed, strict (a value that cannot be parsed
is an error, never a silent default), and the secret key and host rules that DEBUG decides.
``config/settings.py`` reads every variable through these."""

from __future__ import annotations

import ipaddress
import os
import re

from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
)
from django.core.exceptions import ImproperlyConfigured

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _env(name: str) -> str | None:
    """The variable's value, or None when it is unset or blank (``DEBUG=`` means unset)."""
    value = os.environ.get(name, "").strip()
    return value or None


def env_bool(name: str, default: bool) -> bool:
    # A typo such as DEBUG=ture must not quietly mean False (or True).
    value = _env(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={value!r} is not a boolean: use 1/0, true/false, yes/no or on/off."
    )


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    value = _env(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a whole number.") from None
    if number < minimum:
        raise ImproperlyConfigured(f"{name}={value!r} is below its minimum, {minimum}.")
    return number


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    value = _env(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number.") from None
    if number < minimum:
        raise ImproperlyConfigured(f"{name}={value!r} is below its minimum, {minimum}.")
    return number


def env_list(name: str, default: str = "") -> list[str]:
    value = _env(name) or default
    return [item.strip() for item in value.split(",") if item.strip()]


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def env_redis_url(name: str, *, broker_url: str, without: str) -> str:
    """A Redis URL for one use beside the broker: unset, the broker's when it is Redis;
    "none", no Redis ("" — ``without`` says what the use does then, for the error)."""
    value = _env(name)
    if value is None:
        return broker_url if broker_url.startswith(("redis://", "rediss://")) else ""
    if value.lower() == "none":
        return ""
    if not value.startswith(_REDIS_SCHEMES):
        raise ImproperlyConfigured(f'{name}={value!r} is not a redis:// URL (or "none" {without}).')
    return value


# Django compares the proxy's header against request.META, where it is spelled HTTP_X_...;
# a header written as "X-Forwarded-Proto" would never match, and HTTPS would go unnoticed.
_META_HEADER = re.compile(r"^HTTP_[A-Z0-9_]+$")


def env_proxy_ssl_header(name: str) -> tuple[str, str] | None:
    value = _env(name)
    if value is None:
        return None
    header, _, expected = (part.strip() for part in value.partition(","))
    if not _META_HEADER.match(header) or not expected or "," in expected:
        raise ImproperlyConfigured(
            f'{name}={value!r} must be "HTTP_<HEADER>,<value>", '
            'for example "HTTP_X_FORWARDED_PROTO,https".'
        )
    return header, expected


# Known to anyone who can read this repository, so accepted only with DEBUG on.
DEVELOPMENT_SECRET_KEY = "insecure-local-only-key-change-me-in-any-deployment"
GENERATE_SECRET_KEY = (
    "export SECRET_KEY=$(python -c 'import secrets; print(secrets.token_urlsafe(50))')"
)


def secret_key(*, debug: bool) -> str:
    """The key behind everything Django signs: cookies, password-reset links, a
    session's tie to its user's password.

    Anyone who knows it can forge what the console trusts, so outside DEBUG a missing,
    weak or published key stops the process before it serves anything. The weakness
    rule is Django's own (``check --deploy``, security.W009)."""
    key = os.environ.get("SECRET_KEY", "")
    if debug:
        return key or DEVELOPMENT_SECRET_KEY
    if not key.strip():
        problem = "is not set"
    elif key.strip() == DEVELOPMENT_SECRET_KEY:
        problem = "is the development default, which is public"
    elif key.startswith(SECRET_KEY_INSECURE_PREFIX):
        problem = f"starts with {SECRET_KEY_INSECURE_PREFIX!r}, a key generated for development"
    elif len(key) < SECRET_KEY_MIN_LENGTH or len(set(key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS:
        problem = (
            f"is too weak: it needs at least {SECRET_KEY_MIN_LENGTH} characters, "
            f"{SECRET_KEY_MIN_UNIQUE_CHARACTERS} of them different"
        )
    else:
        return key
    raise ImproperlyConfigured(
        f"SECRET_KEY {problem}. With DEBUG off the console refuses to start without a "
        f"secret key of its own. Generate one with:\n    {GENERATE_SECRET_KEY}\n"
        "or, on a development machine only, set DEBUG=1."
    )


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name, or an address with or without brackets) names this machine
    only: localhost and its subdomains, 127.0.0.0/8, ::1."""
    host = host.strip().lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def debug_hosts(hosts: list[str], *, debug: bool) -> list[str]:
    """``hosts``, refused when DEBUG is on and one is not loopback: DEBUG serves the public
    development key (above) and full tracebacks, so it is for this machine only
    (config/gunicorn.conf.py refuses to bind elsewhere with it, for the same reason)."""
    if debug:
        public = [host for host in hosts if not is_loopback_host(host)]
        if public:
            raise ImproperlyConfigured(
                f"DEBUG is on, and ALLOWED_HOSTS names {', '.join(map(repr, public))}: DEBUG "
                "serves a public development key and full tracebacks, so it is for this "
                "machine only (127.0.0.1, localhost, [::1]). Unset DEBUG for any other host."
            )
    return hosts
