"""Bearer tokens checked on each request: one per tenant, compared as SHA-256 digests in constant time.

The tokens are read by the loader (:mod:`mcp_sandbox.config.tokens`: ``MCP_SANDBOX_TOKEN`` for
tenant ``default``, ``token_file``, and ``[auth] tokens`` of the TOML file); SIGHUP re-reads them
with :func:`~mcp_sandbox.config.load_tokens`. The tenant a request runs as is the one its token
names; without auth (stdio, or HTTP on a loopback address with no token configured) every
request is tenant ``default``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from mcp_sandbox.config import DEFAULT_TENANT, TenantToken, load_tokens

__all__ = ["DEFAULT_TENANT", "TenantToken", "TokenTable", "load_tokens", "tenant_of"]


class TokenTable:
    """The SDK's ``TokenVerifier``: a token is valid when its digest is one of the configured ones.

    The ``AccessToken`` a valid token is granted is made once per entry of the table and handed
    to each of its requests (it says only the token and its tenant); :meth:`replace` drops them
    with the entries, so a removed or moved token takes effect on the next request.
    """

    def __init__(self, tokens: Sequence[TenantToken]) -> None:
        self._tokens = tuple(tokens)
        self._granted: dict[TenantToken, AccessToken] = {}

    def __bool__(self) -> bool:
        return bool(self._tokens)

    def replace(self, tokens: Sequence[TenantToken]) -> None:
        """Take ``tokens`` from now on (SIGHUP): requests with a removed token get 401, sessions stay."""
        self._tokens = tuple(tokens)
        self._granted = {}

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(entry.tenant for entry in self._tokens)

    def tenant(self, token: str) -> str | None:
        """The tenant whose token this is, or None. Every entry is compared, in constant time."""
        entry = self._entry(token)
        return None if entry is None else entry.tenant

    def _entry(self, token: str) -> TenantToken | None:
        digest = hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).digest()
        found: TenantToken | None = None
        for entry in self._tokens:
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return found

    async def verify_token(self, token: str) -> AccessToken | None:
        entry = self._entry(token)
        if entry is None:
            return None
        granted = self._granted.get(entry)
        if granted is None:  # the entry's digest is this token's: the same token each time
            granted = self._granted[entry] = AccessToken(token=token, client_id=entry.tenant, scopes=[])
        return granted


def tenant_of(request: Any) -> str:
    """The tenant an MCP request (or an HTTP request) runs as: its token's, else ``default``."""
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    if isinstance(user, AuthenticatedUser):
        return user.access_token.client_id
    return DEFAULT_TENANT
