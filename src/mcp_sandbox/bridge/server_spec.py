"""What one discovered server is (:class:`ServerSpec`), what was not loaded (:class:`Problem`).

A spec never shows a secret: its repr names env and header keys only, and its command line or URL
is shown with passwords, query values and the values of secret-looking flags (``--api-key X``,
``--token=X``) as ``***``. Both classes are re-exported by :mod:`mcp_sandbox.bridge.discovery`,
from which callers import them.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from mcp_sandbox.errors import ConfigError

__all__ = ["Problem", "ServerSpec"]


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


# Arguments whose value is masked when a command line is shown (``--api-key X``, ``--token=X``).
_SECRET_FLAG = re.compile(r"^--?[\w-]*(key|token|secret|passw(or)?d|auth|credential)[\w-]*$", re.IGNORECASE)


def _mask_url(text: str) -> str:
    """Mask a URL's password and query values, which often carry API keys."""
    if "://" not in text:
        return text
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:
        return text
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{userinfo}@{host}"
    query = re.sub(r"=[^&;]*", "=***", parts.query)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _mask_args(args: Iterable[str]) -> list[str]:
    shown: list[str] = []
    secret_next = False
    for arg in args:
        flag, eq, _ = arg.partition("=")
        if secret_next:
            shown.append("***")
        elif eq and _SECRET_FLAG.match(flag):
            shown.append(f"{flag}=***")
        else:
            shown.append(_mask_url(arg))
        secret_next = not eq and bool(_SECRET_FLAG.match(arg))
    return shown


@dataclass(frozen=True, slots=True, repr=False)
class ServerSpec:
    """One downstream MCP server: how to start or reach it, and which of its tools are allowed.

    Exactly one of ``command`` (stdio) and ``url`` (Streamable HTTP) is set. ``env`` and
    ``headers`` hold credentials: the repr shows their keys only.

    Raises:
        ConfigError: neither or both of ``command`` and ``url`` are given.
    """

    alias: str
    name: str
    source: Path
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=_empty)
    cwd: Path | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=_empty)
    allow_tools: frozenset[str] | None = None
    deny_tools: frozenset[str] = frozenset()
    # Which tenants may use the server (None: every tenant); per_tenant: one process (or HTTP
    # client) per tenant, so a server that holds state keeps each tenant's apart. None: not said,
    # which :meth:`separate` decides by the number of tenants.
    tenants: frozenset[str] | None = None
    per_tenant: bool | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"server {self.name!r}: give exactly one of command and url")
        # Copies, so that a caller's dict changed later does not change the spec.
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    @property
    def target(self) -> str:
        """The command line or URL, for display: passwords, query values and secret flags masked."""
        if self.command is None:
            return _mask_url(self.url or "")
        return " ".join(_quote(word) for word in [self.command, *_mask_args(self.args)])

    def serves(self, tenant: str) -> bool:
        """Whether ``tenant`` may see and call this server."""
        return self.tenants is None or tenant in self.tenants

    def separate(self, tenant_count: int) -> bool:
        """Whether each tenant gets a process of its own on a server of ``tenant_count`` tenants.

        As ``per_tenant`` says; when it says nothing, yes with several tenants unless ``tenants``
        names who share it: one process, its credentials and its state are shared only when the
        operator says so.
        """
        if self.per_tenant is not None:
            return self.per_tenant
        return self.tenants is None and tenant_count > 1

    def instance_for(self, tenant: str) -> ServerSpec:
        """The spec of ``tenant``'s own instance of a ``per_tenant`` server: ``{tenant}`` in its
        args, env and header values, cwd and url becomes the tenant's name (so each instance can
        keep its state in a place of its own, e.g. ``MEMORY_FILE_PATH = "/srv/memory/{tenant}.json"``)."""

        def fill(text: str) -> str:
            return text.replace("{tenant}", tenant)

        return dataclasses.replace(
            self,
            args=tuple(fill(arg) for arg in self.args),
            env={key: fill(value) for key, value in self.env.items()},
            headers={key: fill(value) for key, value in self.headers.items()},
            cwd=None if self.cwd is None else Path(fill(str(self.cwd))),
            url=None if self.url is None else fill(self.url),
        )

    def permits(self, tool: str) -> bool:
        """Whether sandboxed code may call ``tool`` (its name as the server lists it)."""
        if tool in self.deny_tools:
            return False
        return self.allow_tools is None or tool in self.allow_tools

    def __repr__(self) -> str:
        where = f"command={self.target!r}" if self.command is not None else f"url={self.target!r}"
        allow = None if self.allow_tools is None else sorted(self.allow_tools)
        tenants = None if self.tenants is None else sorted(self.tenants)
        return (
            f"ServerSpec(alias={self.alias!r}, name={self.name!r}, {where}, env_keys={sorted(self.env)!r}, "
            f"header_keys={sorted(self.headers)!r}, cwd={self.cwd!r}, allow_tools={allow!r}, "
            f"deny_tools={sorted(self.deny_tools)!r}, tenants={tenants!r}, "
            f"per_tenant={self.per_tenant!r}, source={self.source!r})"
        )


def _quote(word: str) -> str:
    # Like shlex.quote, but leaves the common characters of paths, URLs and flags alone.
    if word and re.fullmatch(r"[\w@%+=:,./~*-]+", word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


@dataclass(frozen=True, slots=True)
class Problem:
    """A file or entry that was not loaded, and why (never with a secret value in ``reason``)."""

    source: Path
    reason: str
    server: str | None = None

    def __str__(self) -> str:
        return (
            f"{self.source}: {self.server}: {self.reason}"
            if self.server is not None
            else f"{self.source}: {self.reason}"
        )
