"""Host and Origin checks on every HTTP route (DNS rebinding), as one middleware over the whole app.

A page whose name rebinds to 127.0.0.1 talks to a loopback server with its own name in ``Host``
(and its own origin in ``Origin`` when the browser sends one): every route answers such a
request ``421`` (a foreign Host) or ``403`` (a foreign Origin) before routing, so a route added
later cannot forget the check. The allow-list is the one
:func:`~mcp_sandbox.server.transport.http.transport_security` builds (loopback names, the bound
address, ``public_url``, ``allowed_hosts``/``allowed_origins``). Exempt: the health routes (a
load balancer or kubelet asks them by the pod's address, and they say only up or down) and
``/metrics`` (scraped by address too, and useless without its own token, which a page cannot
know). Refusals are not logged one by one: a flood of them would flood the log.
"""

from __future__ import annotations

from collections.abc import Collection

from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["HostCheck", "allowed"]


def allowed(value: str, patterns: Collection[str]) -> bool:
    """Whether ``value`` is one of ``patterns``, where ``name:*`` stands for ``name`` on any port."""
    if value in patterns:
        return True
    return any(pattern.endswith(":*") and value.startswith(pattern[:-1]) for pattern in patterns)


class HostCheck:
    """Answer ``421`` to a foreign ``Host`` and ``403`` to a foreign ``Origin``, on every path but ``exempt``."""

    def __init__(self, app: ASGIApp, security: TransportSecuritySettings, exempt: Collection[str] = ()) -> None:
        self._app = app
        self._on = security.enable_dns_rebinding_protection
        self._hosts = frozenset(security.allowed_hosts)
        self._origins = frozenset(security.allowed_origins)
        self._exempt = frozenset(exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._on and scope["type"] == "http" and scope["path"] not in self._exempt:
            headers = Headers(scope=scope)
            host = headers.get("host")
            origin = headers.get("origin")
            refusal = None
            if not host or not allowed(host, self._hosts):
                refusal = PlainTextResponse("Invalid Host header", status_code=421)
            elif origin and not allowed(origin, self._origins):
                refusal = PlainTextResponse("Invalid Origin header", status_code=403)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self._app(scope, receive, send)
