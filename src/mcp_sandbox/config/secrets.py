"""Secrets a run's network may use but its code never reads: ``[[secrets]]`` and ``MCP_SANDBOX_SECRET_<NAME>``.

Each secret belongs to one tenant and names where its value comes from (``env:VAR`` or
``file:PATH``, read once when the settings are loaded; never the config file in clear), the
hosts it may go to (required: they join the tenant's allowlist), the header it is applied as
(``header``, ``template`` with ``{value}``) and, optionally, the environment variable that gets a
fresh placeholder in each run (``placeholder_env``) for SDKs that refuse to start without a key.
``MCP_SANDBOX_SECRET_<NAME>`` holds the same keys as a TOML inline table
(``{ value_from = "env:GH_TOKEN", hosts = ["api.github.com"] }``), the secret named ``<name>``.
The egress proxy applies them (:mod:`mcp_sandbox.egress.secrets`). A value is a
:class:`SecretValue`: its ``repr`` and ``str`` show a short hash, never the value.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_sandbox.errors import ConfigError

__all__ = ["ENV_PREFIX", "SecretSpec", "SecretValue", "read_secrets"]

ENV_PREFIX = "MCP_SANDBOX_SECRET_"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_KEYS = frozenset({"name", "tenant", "value_from", "hosts", "header", "template", "placeholder_env"})
# A value shorter than this would be scrubbed out of every response it happens to appear in.
MIN_VALUE = 8


@dataclass(frozen=True, slots=True)
class SecretValue:
    """A secret's value; shown (``repr``, ``str``, logs, errors, doctor) only as :attr:`digest`."""

    _value: str = field(repr=False)

    def reveal(self) -> str:
        """The value itself: for the egress proxy's header, and nothing else."""
        return self._value

    @property
    def digest(self) -> str:
        """``sha256:`` and the first 12 hex digits of the value's SHA-256: enough to tell two values apart."""
        return "sha256:" + hashlib.sha256(self._value.encode()).hexdigest()[:12]

    def __repr__(self) -> str:
        return f"SecretValue({self.digest})"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class SecretSpec:
    """One declared secret (see the module docstring)."""

    name: str
    tenant: str
    value_from: str
    hosts: tuple[str, ...]
    value: SecretValue
    header: str = "Authorization"
    template: str = "Bearer {value}"
    placeholder_env: str | None = None

    def header_value(self) -> str:
        """What the proxy sets :attr:`header` to: the template with the real value."""
        return self.template.replace("{value}", self.value.reveal())


def _value(value_from: object, env: Mapping[str, str], where: str) -> SecretValue:
    if not isinstance(value_from, str) or not value_from.startswith(("env:", "file:")):
        raise ConfigError(f"{where} value_from: must be env:VARIABLE or file:PATH")
    kind, _, source = value_from.partition(":")
    if kind == "env":
        if source not in env or not env[source]:
            raise ConfigError(f"{where} value_from: the environment variable {source} is not set")
        value = env[source]
    else:
        try:
            value = Path(source).expanduser().read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where} value_from: cannot read {source}: {exc}") from None
    if not value.isascii() or any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        raise ConfigError(f"{where} value_from: the value holds a control or non-ASCII character (a header cannot)")
    if len(value) < MIN_VALUE:
        raise ConfigError(f"{where} value_from: the value is shorter than {MIN_VALUE} characters")
    return SecretValue(value)


def _spec(entry: Mapping[str, Any], env: Mapping[str, str], where: str) -> SecretSpec:
    unknown = set(entry) - _KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (keys: {', '.join(sorted(_KEYS))})")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where} name: must be 1-64 lower-case letters, digits, '-' or '_'")
    where = f"{where} ({name})"
    tenant = entry.get("tenant", "default")
    if not isinstance(tenant, str) or not tenant:
        raise ConfigError(f"{where} tenant: must be a tenant's name")
    hosts = entry.get("hosts")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(host, str) and host for host in hosts):
        raise ConfigError(f"{where} hosts: required, a list of domain patterns the secret may go to")
    if "*" in hosts:
        raise ConfigError(f"{where} hosts: '*' would send the secret anywhere; name its hosts")
    header = entry.get("header", "Authorization")
    if not isinstance(header, str) or not _HEADER.match(header) or header.lower() in ("host", "content-length"):
        raise ConfigError(f"{where} header: must be an HTTP header name (not Host or Content-Length)")
    template = entry.get("template", "Bearer {value}")
    if (
        not isinstance(template, str)
        or "{value}" not in template
        or not template.isprintable()
        or not template.isascii()
    ):
        raise ConfigError(f"{where} template: must be printable ASCII holding {{value}}")
    placeholder_env = entry.get("placeholder_env")
    if placeholder_env is not None and (not isinstance(placeholder_env, str) or not _ENV_NAME.match(placeholder_env)):
        raise ConfigError(f"{where} placeholder_env: must be an environment variable's name")
    value_from = entry.get("value_from")
    return SecretSpec(
        name=name,
        tenant=tenant,
        value_from=str(value_from),
        hosts=tuple(hosts),
        value=_value(value_from, env, where),
        header=header,
        template=template,
        placeholder_env=placeholder_env,
    )


def _env_entries(env: Mapping[str, str]) -> list[tuple[dict[str, Any], str]]:
    entries = []
    for key in sorted(env):
        if not key.startswith(ENV_PREFIX) or key == ENV_PREFIX:
            continue
        try:
            table = tomllib.loads(f"secret = {env[key]}")["secret"]
        except tomllib.TOMLDecodeError:
            table = None
        if not isinstance(table, dict):
            raise ConfigError(f'{key}: must be a TOML inline table ({{ value_from = "env:VAR", hosts = ["..."] }})')
        if "name" in table:
            raise ConfigError(f"{key}: the name is the variable's suffix; give no `name`")
        entries.append(({"name": key.removeprefix(ENV_PREFIX).lower(), **table}, key))
    return entries


def read_secrets(entries: object, env: Mapping[str, str], where: str) -> tuple[SecretSpec, ...]:
    """The secrets of the file's ``[[secrets]]`` ``entries`` (``where`` names the file) and of ``env``.

    Values are read here, once: ``env:`` from ``env``, ``file:`` from the file.

    Raises:
        ConfigError: an entry is malformed, its value cannot be read, or two of a tenant share a name.
    """
    if entries is None:
        entries = []
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ConfigError(f"{where}: [[secrets]] must be an array of tables")
    found = [_spec(entry, env, f"{where} [[secrets]]") for entry in entries]
    found += [_spec(entry, env, key) for entry, key in _env_entries(env)]
    seen: set[tuple[str, str]] = set()
    for spec in found:
        if (spec.tenant, spec.name) in seen:
            raise ConfigError(f"secret {spec.name!r} of tenant {spec.tenant!r} is declared twice")
        seen.add((spec.tenant, spec.name))
    return tuple(found)
