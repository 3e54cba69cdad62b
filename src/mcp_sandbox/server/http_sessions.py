"""A quota per tenant on MCP sessions over HTTP: Streamable HTTP's and SSE's, counted together.

The SDK caps Streamable HTTP sessions for the whole server (10,000 by default, each kept 30
minutes idle): one tenant opening them all left every other with ``503`` for half an hour
(issue 21). Here a tenant holds at most ``tenant_http_sessions`` sessions; a request that would
open one more is answered ``429`` with a JSON-RPC error that says so, and the server-wide cap
(``max_http_sessions``) and idle life (``http_session_ttl``) are ours, passed to the SDK.

The SDK binds each session to the credential that opened it (a request for another tenant's
session, Streamable HTTP or SSE, is answered ``404``); the live Streamable HTTP sessions and
their owners are read from its session manager (``mcp`` 2.3: ``_server_instances``,
``_session_owners``; ``tests/e2e/test_tenants_http.py`` breaks if that changes).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_sandbox.server.auth import DEFAULT_TENANT

__all__ = ["SessionQuota"]

_SESSION_HEADER = MCP_SESSION_ID_HEADER.encode()
_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.encode()


def _tenant(scope: Scope) -> str:
    user = scope.get("user")
    return user.access_token.client_id if isinstance(user, AuthenticatedUser) else DEFAULT_TENANT


class SessionQuota:
    """Sessions per tenant: see the module docstring."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._manager: StreamableHTTPSessionManager | None = None
        self._sse: collections.Counter[str] = collections.Counter()
        self._opening: collections.Counter[str] = collections.Counter()  # requests opening a session now

    def attach(self, manager: StreamableHTTPSessionManager) -> None:
        """Gate the requests that open a Streamable HTTP session of ``manager``."""
        self._manager = manager
        manager.asgi_app.app = self._gate(manager.asgi_app.app)

    def held(self, tenant: str) -> int:
        """Sessions ``tenant`` holds or is opening now, on both transports."""
        return self._streamable(tenant) + self._sse[tenant] + self._opening[tenant]

    def _streamable(self, tenant: str) -> int:
        manager = self._manager
        if manager is None:
            return 0
        owners: dict[str, Any] = manager._session_owners  # private in the SDK: see the module docstring
        return sum(
            1
            for session in list(manager._server_instances)
            if (owners[session]["client_id"] if session in owners else DEFAULT_TENANT) == tenant
        )

    def refusal(self, tenant: str) -> JSONResponse | None:
        """The ``429`` answer when ``tenant`` may open no more sessions, else None."""
        held = self.held(tenant)
        if held < self.per_tenant:
            return None
        message = (
            f"this tenant has {held} MCP sessions open, the most one tenant may (tenant_http_sessions); "
            "close one (DELETE /mcp with its Mcp-Session-Id) or wait until an idle one expires"
        )
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
        return JSONResponse(body, status_code=429, headers={"Retry-After": "10"})

    @contextlib.contextmanager
    def sse_session(self, tenant: str) -> Iterator[None]:
        """Count one SSE session of ``tenant`` for the block (the stream's life)."""
        self._sse[tenant] += 1
        try:
            yield
        finally:
            self._sse[tenant] -= 1
            if not self._sse[tenant]:
                del self._sse[tenant]

    def _gate(self, app: ASGIApp) -> ASGIApp:
        async def gate(scope: Scope, receive: Receive, send: Send) -> None:
            headers = dict(scope.get("headers", ()))
            version = headers.get(_VERSION_HEADER)
            opens = (
                scope.get("method") == "POST"
                and _SESSION_HEADER not in headers
                and (version is None or version.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS)
            )
            if not opens:
                await app(scope, receive, send)
                return
            tenant = _tenant(scope)
            refused = self.refusal(tenant)
            if refused is not None:
                await refused(scope, receive, send)
                return
            self._opening[tenant] += 1
            try:
                await app(scope, receive, send)
            finally:
                self._opening[tenant] -= 1
                if not self._opening[tenant]:
                    del self._opening[tenant]

        return gate
