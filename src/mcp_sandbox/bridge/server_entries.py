"""One server entry as found in a file, turned into a :class:`ServerSpec` or the reason it is not.

The keys and types of each format, ``${VAR}`` expansion, the detection of an entry that would start
mcp-sandbox itself, ``[servers.<name>]`` tool policies, and aliases. The rules themselves are
documented in :mod:`mcp_sandbox.bridge.discovery`; the reading of files is in
:mod:`mcp_sandbox.bridge.config_files`.
"""

from __future__ import annotations

import dataclasses
import keyword
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from mcp_sandbox.bridge.server_spec import ServerSpec

__all__ = [
    "Entry",
    "Expander",
    "InvalidEntry",
    "Policy",
    "Skip",
    "alias_for",
    "check_entry",
    "is_policy",
    "read_policy",
    "restrict",
]


@dataclass(frozen=True, slots=True)
class Entry:
    """A server entry as found, not yet checked."""

    name: str
    body: object
    source: Path
    toml: bool


@dataclass(frozen=True, slots=True)
class Policy:
    """A ``[servers.<name>]`` table that only restricts a server defined elsewhere."""

    source: Path
    allow: frozenset[str] | None
    deny: frozenset[str]
    disabled: bool
    tenants: frozenset[str] | None = None
    per_tenant: bool | None = None  # None: not said


_POLICY_KEYS = frozenset({"allow_tools", "deny_tools", "disabled", "tenants", "per_tenant"})


class InvalidEntry(Exception):
    """An entry is malformed (the message is the reason, without any value from the entry)."""


def _names(body: Mapping[str, Any], key: str) -> frozenset[str] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        what = "tenant" if key == "tenants" else "tool"
        raise InvalidEntry(f"{key}: must be a list of {what} names")
    return frozenset(value)


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise InvalidEntry(f"{key}: must be true or false")
    return value


def _said_flag(body: Mapping[str, Any], key: str) -> bool | None:
    """A flag, or None when ``body`` does not name it (the default then depends on the caller)."""
    return _flag(body, key) if key in body else None


def _string(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidEntry(f"{key}: must be a string")
    return value


def _strings(body: Mapping[str, Any], key: str) -> list[str]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidEntry(f"{key}: must be a list of strings")
    return value


def _table(body: Mapping[str, Any], key: str) -> dict[str, str]:
    value = body.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(item, str) for item in value.values()):
        raise InvalidEntry(f"{key}: must be an object of strings")
    return value


def is_policy(body: object) -> bool:
    """Whether a ``[servers.<name>]`` table is a tool policy: no command or url, only policy keys."""
    return isinstance(body, dict) and "command" not in body and "url" not in body and body.keys() <= _POLICY_KEYS


def read_policy(source: Path, body: Mapping[str, Any]) -> Policy:
    """The policy a table (:func:`is_policy`) in ``source`` holds.

    Raises:
        InvalidEntry: the table is empty or a value has the wrong type.
    """
    if not body:
        raise InvalidEntry("needs a command or url (or allow_tools/deny_tools for a server found elsewhere)")
    return Policy(
        source,
        allow=_names(body, "allow_tools"),
        deny=_names(body, "deny_tools") or frozenset(),
        disabled=_flag(body, "disabled"),
        tenants=_names(body, "tenants"),
        per_tenant=_said_flag(body, "per_tenant"),
    )


_TOML_KEYS = frozenset({"command", "args", "env", "cwd", "url", "headers"}) | _POLICY_KEYS
_HTTP_TYPES = frozenset({"http", "sse", "streamable-http", "streamableHttp"})
_VARIABLE = re.compile(r"\$\{([^{}]*)\}")
_NAMED = re.compile(r"(?:env:)?([A-Za-z_]\w*)(?::-(.*))?", re.DOTALL)


@dataclass(slots=True)
class Expander:
    """Expands ``${...}`` from the environment, collecting what does not resolve."""

    env: Mapping[str, str]
    predefined: Mapping[str, str]
    unresolved: list[str] = field(default_factory=list)

    def __call__(self, text: str, where: str) -> str:
        return _VARIABLE.sub(lambda match: self._value(match, where), text)

    def _value(self, match: re.Match[str], where: str) -> str:
        inner = match.group(1)
        named = _NAMED.fullmatch(inner)
        if named is None:
            kind = "VS Code input" if inner.startswith("input:") else "unsupported variable"
            self.unresolved.append(f"{kind} {match.group()} (in {where})")
            return ""
        name, default = named.groups()
        value = self.env.get(name)
        if value is None:
            value = self.predefined.get(name)
        if default is not None and not value:
            value = default
        if value is None:
            self.unresolved.append(f"environment variable {name} is not set (in {where})")
            return ""
        return value


def _launches_us(command: str, args: tuple[str, ...]) -> bool:
    if PurePath(command).name == "mcp-sandbox":
        return True
    for index, arg in enumerate(args):
        # mcp-sandbox, mcp_sandbox, mcp-sandbox@latest, mcp-sandbox==0.1 (uvx, pipx), .../bin/mcp-sandbox
        if re.fullmatch(r"mcp[-_]sandbox(\[[^]]*\])?([@=<>~!].*)?", arg) or arg.endswith("/mcp-sandbox"):
            return True
        if arg == "-m" and index + 1 < len(args) and args[index + 1].startswith("mcp_sandbox."):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Skip:
    """An entry deliberately not loaded (disabled, or mcp-sandbox itself), and why."""

    reason: str


def check_entry(entry: Entry, expand: Expander, home: Path) -> ServerSpec | Skip:
    """The server an entry describes (alias still empty), or why it is skipped.

    Raises:
        InvalidEntry: the entry is malformed or a variable does not resolve.
    """
    body = entry.body
    if not isinstance(body, dict):
        raise InvalidEntry("not an object")
    if entry.toml:
        unknown = sorted(set(body) - _TOML_KEYS)
        if unknown:
            raise InvalidEntry(f"unknown key(s): {', '.join(unknown)}")
    if _flag(body, "disabled"):
        return Skip("disabled")

    command = _string(body, "command")
    args = _strings(body, "args")
    env = _table(body, "env")
    cwd = _string(body, "cwd")
    headers = _table(body, "headers")
    url = _string(body, "url")
    if not entry.toml:
        server_url = _string(body, "serverUrl")  # Windsurf
        if url is not None and server_url is not None:
            raise InvalidEntry("give url or serverUrl, not both")
        url = url if url is not None else server_url
    allow_key, deny_key = ("allow_tools", "deny_tools") if entry.toml else ("allowTools", "denyTools")
    allow = _names(body, allow_key)
    deny = _names(body, deny_key) or frozenset()

    kind = None if entry.toml else _string(body, "type")
    if kind is not None and kind != "stdio" and kind not in _HTTP_TYPES:
        raise InvalidEntry("type: must be stdio, http, sse or streamable-http")
    if command is not None and url is not None:
        raise InvalidEntry("give command or url, not both")
    if command is None and url is None:
        raise InvalidEntry("needs a command (stdio) or a url (HTTP)")
    if kind == "stdio" and command is None:
        raise InvalidEntry("type stdio needs a command")
    if kind in _HTTP_TYPES and url is None:
        raise InvalidEntry(f"type {kind} needs a url")

    if command is not None:
        command = expand(command, "command")
        if not command:
            raise InvalidEntry("command: is empty")
    expanded_args = tuple(expand(arg, f"args[{index}]") for index, arg in enumerate(args))
    env = {key: expand(value, f"env.{key}") for key, value in env.items()}
    headers = {key: expand(value, f"headers.{key}") for key, value in headers.items()}
    cwd = None if cwd is None else expand(cwd, "cwd")
    if url is not None:
        url = expand(url, "url")
    if expand.unresolved:
        raise InvalidEntry("; ".join(expand.unresolved))
    if url is not None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidEntry("url: must be an http:// or https:// URL")
    if command is not None and _launches_us(command, expanded_args):
        return Skip("starts mcp-sandbox itself")

    directory: Path | None = None
    if cwd is not None:
        if cwd == "~" or cwd.startswith("~/"):
            cwd = str(home / cwd[2:])
        directory = entry.source.parent / cwd
    return ServerSpec(
        alias="",
        name=entry.name,
        source=entry.source,
        command=command,
        args=expanded_args,
        env=env,
        cwd=directory,
        url=url,
        headers=headers,
        allow_tools=allow,
        deny_tools=deny,
        # Tenancy is the operator's: only our TOML says which tenants share a server.
        tenants=_names(body, "tenants") if entry.toml else None,
        per_tenant=_said_flag(body, "per_tenant") if entry.toml else None,
    )


def restrict(spec: ServerSpec, policy: Policy) -> ServerSpec:
    """Apply a ``[servers.<name>]`` policy: allow lists (of tools, of tenants) intersect, deny lists add up."""
    allow = spec.allow_tools
    if policy.allow is not None:
        allow = policy.allow if allow is None else allow & policy.allow
    tenants = spec.tenants
    if policy.tenants is not None:
        tenants = policy.tenants if tenants is None else tenants & policy.tenants
    return dataclasses.replace(
        spec,
        allow_tools=allow,
        deny_tools=spec.deny_tools | policy.deny,
        tenants=tenants,
        per_tenant=spec.per_tenant if policy.per_tenant is None else policy.per_tenant or bool(spec.per_tenant),
    )


def alias_for(name: str, taken: Mapping[str, object]) -> str:
    """The Python identifier for server ``name``, not one of ``taken`` (rules in the discovery docstring)."""
    base = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
    if not base:
        base = "server"
    elif base[0].isdigit():
        base = f"s_{base}"
    if keyword.iskeyword(base):
        base += "_"
    alias, number = base, 2
    while alias in taken:
        alias, number = f"{base}_{number}", number + 1
    return alias
