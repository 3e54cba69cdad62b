"""A quota per tenant on MCP sessions over HTTP: Streamable HTTP's and SSE's, counted together.

The SDK caps Streamable HTTP sessions for the whole server (10,000 by default, each kept 30
minutes idle): one tenant opening them all left every other with ``503`` for half an hour
(issue 21). Here a tenant holds at most ``tenant_http_sessions`` sessions; a request that would
open one more is answered ``429`` with a JSON-RPC error that says so, and the server-wide cap
(``max_http_sessions``) and idle life (``http_session_ttl``) are ours, passed to the SDK.

An SSE session has the same idle life: :class:`SseIdle` ends its stream once no message was
posted to it for ``http_session_ttl``.
"""

from __future__ import annotations

import collections
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_sandbox.server.auth.tokens import DEFAULT_TENANT

__all__ = ["SessionQuota", "SseIdle"]

_SESSION_HEADER = MCP_SESSION_ID_HEADER.encode()
_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.encode()
_SSE_SESSION = re.compile(rb"session_id=([0-9a-f]{32})")


def _tenant(scope: Scope) -> str:
    user = scope.get("user")
    return user.access_token.client_id if isinstance(user, AuthenticatedUser) else DEFAULT_TENANT


class SessionQuota:
    """Sessions per tenant: see the module docstring.

    The SDK binds each session to the credential that opened it (a request for another tenant's
    session, Streamable HTTP or SSE, is answered ``404``); the live Streamable HTTP sessions and
    their owners are read from its session manager (``mcp`` 2.3: ``_server_instances``,
    ``_session_owners``; ``tests/e2e/tenants/test_tenants_http.py`` breaks if that changes).
    """

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
        owners: dict[str, Any] = manager._session_owners  # private in the SDK: see the class docstring
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


class SseIdle:
    """Ends an SSE session's stream once no message was posted to it for ``ttl`` seconds."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._last: dict[str, float] = {}  # session id (hex) -> when a message was last posted

    def messages(self, app: ASGIApp) -> ASGIApp:
        """Wrap the route that takes posted messages, so each one counts as activity."""

        async def touched(scope: Scope, receive: Receive, send: Send) -> None:
            found = _SSE_SESSION.search(scope.get("query_string", b""))
            if found is not None and found.group(1).decode() in self._last:
                self._last[found.group(1).decode()] = anyio.current_time()
            await app(scope, receive, send)

        return touched

    @contextlib.asynccontextmanager
    async def watched(self, send: Send) -> AsyncIterator[_SseStream]:
        """For one SSE stream: a ``send`` that learns its session id; the block is cancelled when idle,
        and the response is then ended properly (the client sees the stream end, not a broken one)."""
        stream = _SseStream(send)

        async def watchdog(cancel: anyio.CancelScope) -> None:
            started = anyio.current_time()
            while True:
                session = stream.session
                last = self._last.get(session, started) if session is not None else started
                remaining = last + self.ttl - anyio.current_time()
                if remaining <= 0:
                    cancel.cancel()
                    return
                await anyio.sleep(remaining)

        stream.on_session = lambda session: self._last.__setitem__(session, anyio.current_time())
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(watchdog, group.cancel_scope)
                yield stream
                group.cancel_scope.cancel()
            if stream.started and not stream.completed:  # ended here for idleness
                with anyio.CancelScope(shield=True):
                    await stream.send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if stream.session is not None:
                self._last.pop(stream.session, None)


class _SseStream:
    """The ``send`` of one SSE response, watched: its session id, whether it started and ended."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.session: str | None = None
        self.started = False
        self.completed = False
        self.on_session: Any = None

    async def send(self, message: Message) -> None:
        if message.get("type") == "http.response.start":
            self.started = True
        elif message.get("type") == "http.response.body":
            if self.session is None and (found := _SSE_SESSION.search(message.get("body", b""))) is not None:
                self.session = found.group(1).decode()
                if self.on_session is not None:
                    self.on_session(self.session)
            self.completed = self.completed or not message.get("more_body", False)
        await self._send(message)
