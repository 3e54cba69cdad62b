"""Bearer tokens: one per tenant, kept only as SHA-256 digests, compared in constant time.

Tokens come from ``MCP_SANDBOX_TOKEN`` (tenant ``default``) and from the TOML file::

    [auth]
    tokens = [
      { tenant = "alice", token = "s3cr3t-alice" },
      { tenant = "bob",   token = "sha256:9f86d08…" },   # the digest of the token, not the token
    ]

The tenant a request runs as is the one its token names; without auth (stdio, or HTTP on a
loopback address with no token configured) every request is tenant ``default``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from mcp_sandbox.config import Settings
from mcp_sandbox.errors import ConfigError

__all__ = ["DEFAULT_TENANT", "TenantToken", "TokenTable", "load_tokens", "tenant_of"]

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


def _entries_from_file(settings: Settings) -> list[Any]:
    if settings.config_file is None:
        return []
    try:
        data = tomllib.loads(settings.config_file.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {settings.config_file}: {exc}") from exc
    table = data.get("auth", {})
    if not isinstance(table, dict) or set(table) - {"tokens"}:
        raise ConfigError(f"config file {settings.config_file}: [auth] takes only `tokens`")
    entries = table.get("tokens", [])
    if not isinstance(entries, list):
        raise ConfigError(f"config file {settings.config_file}: [auth] tokens must be a list of tables")
    return entries


def load_tokens(settings: Settings) -> tuple[TenantToken, ...]:
    """The configured tenants and token digests.

    Raises:
        ConfigError: an entry is malformed, a tenant name is invalid, a token is too short, or one
            token is given to two tenants.
    """
    tokens: list[TenantToken] = []
    if settings.token is not None:
        tokens.append(TenantToken(DEFAULT_TENANT, _digest(settings.token, "MCP_SANDBOX_TOKEN")))
    if settings.token_file is not None:
        try:
            token = settings.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"token_file: {settings.token_file}: {exc.strerror}") from exc
        tokens.append(TenantToken(DEFAULT_TENANT, _digest(token, f"token_file {settings.token_file}")))
    for index, entry in enumerate(_entries_from_file(settings)):
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


class TokenTable:
    """The SDK's ``TokenVerifier``: a token is valid when its digest is one of the configured ones."""

    def __init__(self, tokens: Sequence[TenantToken]) -> None:
        self._tokens = tuple(tokens)

    def __bool__(self) -> bool:
        return bool(self._tokens)

    def replace(self, tokens: Sequence[TenantToken]) -> None:
        """Take ``tokens`` from now on (SIGHUP): requests with a removed token get 401, sessions stay."""
        self._tokens = tuple(tokens)

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(entry.tenant for entry in self._tokens)

    def tenant(self, token: str) -> str | None:
        """The tenant whose token this is, or None. Every entry is compared, in constant time."""
        digest = hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).digest()
        found: str | None = None
        for entry in self._tokens:
            if hmac.compare_digest(digest, entry.digest):
                found = entry.tenant
        return found

    async def verify_token(self, token: str) -> AccessToken | None:
        tenant = self.tenant(token)
        if tenant is None:
            return None
        return AccessToken(token=token, client_id=tenant, scopes=[])


def tenant_of(request: Any) -> str:
    """The tenant an MCP request (or an HTTP request) runs as: its token's, else ``default``."""
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    if isinstance(user, AuthenticatedUser):
        return user.access_token.client_id
    return DEFAULT_TENANT
