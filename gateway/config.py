"""The gateway's TOML configuration: where it listens, which upstream MCP servers it stands
in front of, the tenant and runtime key each acts under, and an admin's overrides per tool.

    [gateway]
    name = "shop-gateway"          # its journal rows are this name's
    port = 8765                    # streamable HTTP at http://127.0.0.1:8765/mcp
    console_url = "http://127.0.0.1:8000"   # where reviewers open the review page

    [upstreams.shop]
    command = ["python", "-m", "demo.mcp_shop"]   # or: url = "http://127.0.0.1:8300/mcp"
    tenant = "demo"
    runtime_key_env = "SHOP_RUNTIME_KEY"          # the key itself is never in the file

    [upstreams.shop.tools.issue_refund]
    approvals_required = 2
    sensitive = ["order_id"]

Read once at start; a mistake is a ``ConfigError`` naming the key, never half a gateway.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

# Upstream names become tool-name prefixes (``shop__issue_refund``): MCP tool names allow
# these characters, and the double underscore keeps the prefix apart from the tool's name.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")
PREFIX_SEPARATOR = "__"

_OVERRIDE_KEYS = {
    "review",
    "sensitive",
    "approvals_required",
    "quorum_amount_argument",
    "quorum_currency_argument",
    "quorum_thresholds_minor",
    "replay_safety",
    "risk",
    "review_deadline_seconds",
    "final_deadline_seconds",
}
_REPLAY_SAFETIES = {"read_only", "idempotent_with_key", "effect_queryable", "unsafe"}


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key."""


@dataclass(frozen=True)
class ToolOverride:
    """An admin's decisions about one upstream tool, over what its annotations say."""

    # True: a human reviews every call, even of a read-only tool; False: a read-only tool
    # passes by policy (the default for read-only tools); None: the annotations decide.
    review: bool | None = None
    sensitive: tuple[str, ...] = ()
    approvals_required: int | None = None
    quorum_amount_argument: str = ""
    quorum_currency_argument: str = ""
    quorum_thresholds_minor: dict[str, int] = field(default_factory=dict)
    replay_safety: str = ""
    risk: str = ""
    review_deadline: timedelta | None = None
    final_deadline: timedelta | None = None


@dataclass(frozen=True)
class Upstream:
    name: str
    tenant: str
    runtime_key: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    tools: dict[str, ToolOverride] = field(default_factory=dict)

    def prefixed(self, tool: str) -> str:
        return f"{self.name}{PREFIX_SEPARATOR}{tool}"


@dataclass(frozen=True)
class GatewayConfig:
    name: str
    host: str
    port: int
    console_url: str
    upstreams: tuple[Upstream, ...]
    # How often a waiting call reads its decision, and sends the client a progress note.
    poll_seconds: float = 0.5
    progress_seconds: float = 5.0


def _require(table: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = table.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ConfigError(f"{where}.{key}: expected a {kind.__name__}")
    return value


def _optional(table: dict[str, Any], key: str, kind: type, where: str, default: Any) -> Any:
    if key not in table:
        return default
    return _require(table, key, kind, where)


def _number(table: dict[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"gateway.{key}: a positive number of seconds")
    return float(value)


def _seconds(table: dict[str, Any], key: str, where: str) -> timedelta | None:
    value = _optional(table, key, int, where, None)
    if value is None:
        return None
    if value <= 0:
        raise ConfigError(f"{where}.{key}: a positive number of seconds")
    return timedelta(seconds=value)


def _override(table: Any, where: str) -> ToolOverride:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    unknown = set(table) - _OVERRIDE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    sensitive = _optional(table, "sensitive", list, where, [])
    if not all(isinstance(name, str) for name in sensitive):
        raise ConfigError(f"{where}.sensitive: a list of argument names")
    replay_safety = _optional(table, "replay_safety", str, where, "")
    if replay_safety and replay_safety not in _REPLAY_SAFETIES:
        raise ConfigError(f"{where}.replay_safety: one of {', '.join(sorted(_REPLAY_SAFETIES))}")
    required = _optional(table, "approvals_required", int, where, None)
    if required is not None and required < 1:
        raise ConfigError(f"{where}.approvals_required: 1 or more")
    thresholds = _optional(table, "quorum_thresholds_minor", dict, where, {})
    return ToolOverride(
        review=_optional(table, "review", bool, where, None),
        sensitive=tuple(sensitive),
        approvals_required=required,
        quorum_amount_argument=_optional(table, "quorum_amount_argument", str, where, ""),
        quorum_currency_argument=_optional(table, "quorum_currency_argument", str, where, ""),
        quorum_thresholds_minor=dict(thresholds),
        replay_safety=replay_safety,
        risk=_optional(table, "risk", str, where, ""),
        review_deadline=_seconds(table, "review_deadline_seconds", where),
        final_deadline=_seconds(table, "final_deadline_seconds", where),
    )


def _runtime_key(table: dict[str, Any], where: str, environ: dict[str, str]) -> str:
    variable = _optional(table, "runtime_key_env", str, where, "")
    if variable:
        key = environ.get(variable, "")
        if not key:
            raise ConfigError(f"{where}.runtime_key_env: the environment has no {variable}")
        return key
    if "runtime_key" in table:
        return str(_require(table, "runtime_key", str, where))
    raise ConfigError(f"{where}: set runtime_key_env (the variable holding the runtime key)")


def _upstream(name: str, table: Any, environ: dict[str, str]) -> Upstream:
    where = f"upstreams.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: a name of letters, digits, - and _ (at most 40)")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    command = _optional(table, "command", list, where, [])
    url = _optional(table, "url", str, where, "")
    if bool(command) == bool(url):
        raise ConfigError(f"{where}: set either command (a stdio server) or url, not both")
    if not all(isinstance(part, str) for part in command):
        raise ConfigError(f"{where}.command: a list of strings")
    env = _optional(table, "env", dict, where, {})
    tools = _optional(table, "tools", dict, where, {})
    return Upstream(
        name=name,
        tenant=_require(table, "tenant", str, where),
        runtime_key=_runtime_key(table, where, environ),
        command=tuple(command),
        url=url,
        env={str(k): str(v) for k, v in env.items()},
        cwd=_optional(table, "cwd", str, where, ""),
        tools={tool: _override(t, f"{where}.tools.{tool}") for tool, t in tools.items()},
    )


def parse_config(text: str, *, environ: dict[str, str] | None = None) -> GatewayConfig:
    """The configuration in ``text`` (TOML); ``environ`` resolves ``runtime_key_env``."""
    environ = dict(os.environ) if environ is None else environ
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not TOML: {exc}") from exc
    gateway = _optional(data, "gateway", dict, "", {})
    upstreams = _optional(data, "upstreams", dict, "", {})
    if not upstreams:
        raise ConfigError("upstreams: name at least one upstream MCP server")
    name = _optional(gateway, "name", str, "gateway", "gateway")
    if not _NAME.match(name):
        raise ConfigError("gateway.name: a name of letters, digits, - and _ (at most 40)")
    from django.conf import settings

    return GatewayConfig(
        name=name,
        host=_optional(gateway, "host", str, "gateway", "127.0.0.1"),
        port=_optional(gateway, "port", int, "gateway", 8765),
        console_url=_optional(gateway, "console_url", str, "gateway", settings.CONSOLE_BASE_URL),
        upstreams=tuple(_upstream(n, t, environ) for n, t in upstreams.items()),
        poll_seconds=_number(gateway, "poll_seconds", 0.5),
        progress_seconds=_number(gateway, "progress_seconds", 5.0),
    )


def load_config(path: str | Path) -> GatewayConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    return parse_config(text)
