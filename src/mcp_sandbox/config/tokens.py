"""Bearer tokens: one per tenant, kept only as SHA-256 digests.

Tokens come from ``token`` (``MCP_SANDBOX_TOKEN``, tenant ``default``), ``token_file`` and the
TOML file::

    [auth]
    tokens = [
      { tenant = "alice", token = "s3cr3t-alice" },
      { tenant = "bob",   token = "sha256:9f86d08…" },   # the digest of the token, not the token
    ]
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcp_sandbox.config.file import read_config_file
from mcp_sandbox.errors import ConfigError

if TYPE_CHECKING:
    from mcp_sandbox.config.server_pieces import AuthSettings
    from mcp_sandbox.config.settings import Settings

__all__ = ["DEFAULT_TENANT", "TenantToken", "load_tokens", "read_tokens"]

DEFAULT_TENANT = "default"

_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_DIGEST_RE = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
_MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True, slots=True)
class TenantToken:
    """A tenant and the SHA-256 digest of its bearer token (the token itself is not kept)."""

    tenant: str
    digest: bytes

    def __repr__(self) -> str:
        return f"TenantToken(tenant={self.tenant!r})"


def _digest(token: str, where: str) -> bytes:
    match = _DIGEST_RE.match(token)
    if match is not None:
        return bytes.fromhex(match.group(1))
    if len(token) < _MIN_TOKEN_LENGTH or token != token.strip():
        raise ConfigError(
            f"{where}: a token must be at least {_MIN_TOKEN_LENGTH} characters without surrounding spaces "
            "(generate one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return hashlib.sha256(token.encode()).digest()


def read_tokens(
    auth: AuthSettings, entries: Sequence[Any], token_name: str = "MCP_SANDBOX_TOKEN"
) -> tuple[TenantToken, ...]:
    """The tenants and token digests of ``auth`` (``token``, ``token_file``) and ``[auth] tokens``.

    ``token_name`` is where ``token`` was given (a variable or flag), for the error naming it.

    Raises:
        ConfigError: an entry is malformed, a tenant name is invalid, a token is too short, or one
            token is given to two tenants.
    """
    tokens: list[TenantToken] = []
    if auth.token is not None:
        tokens.append(TenantToken(DEFAULT_TENANT, _digest(auth.token, token_name)))
    if auth.token_file is not None:
        try:
            token = auth.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"token_file: {auth.token_file}: {exc.strerror}") from exc
        tokens.append(TenantToken(DEFAULT_TENANT, _digest(token, f"token_file {auth.token_file}")))
    for index, entry in enumerate(entries):
        where = f"[auth] tokens[{index}]"
        if not isinstance(entry, dict) or set(entry) != {"tenant", "token"}:
            raise ConfigError(f'{where}: must be {{ tenant = "name", token = "..." }}')
        tenant, token = entry["tenant"], entry["token"]
        if not isinstance(tenant, str) or not _TENANT_RE.match(tenant):
            raise ConfigError(f"{where}: tenant {tenant!r} must be 1-64 letters, digits, or _.@- characters")
        if not isinstance(token, str):
            raise ConfigError(f"{where}: token must be a string")
        tokens.append(TenantToken(tenant, _digest(token, where)))
    owners: dict[bytes, str] = {}
    for entry in tokens:
        other = owners.setdefault(entry.digest, entry.tenant)
        if other != entry.tenant:
            raise ConfigError(f"[auth]: one token is given to two tenants ({other!r} and {entry.tenant!r})")
    return tuple(tokens)


def load_tokens(settings: Settings) -> tuple[TenantToken, ...]:
    """The tokens as configured now: ``token_file`` and the TOML file read again (SIGHUP).

    Raises:
        ConfigError: the file cannot be read or parsed, or a token is malformed (see :func:`read_tokens`).
    """
    entries = [] if settings.config_file is None else read_config_file(settings.config_file).auth_tokens
    return read_tokens(settings.auth, entries)
