"""The replicas' internal listener (``internal_port``): ``/internal/`` apart from the clients' port.

One uvicorn server serves both ports: the internal sockets are added to its servers as it starts,
with a protocol of their own configuration (the internal app, the TLS context), so the drain,
the stop and the connection bounds are the public port's. With ``internal_cert`` the port speaks
TLS only (the standard :mod:`ssl` module, so a bad file is a start-up error naming the setting);
with ``replica_ca`` as well, a caller must present a certificate that CA signed (mutual TLS),
which a replica does when it calls another (:mod:`mcp_sandbox.replicas.peers`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.server import ServerState

from mcp_sandbox.config import HttpSettings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.server.transport.limits import SlowBodyGuard, uvicorn_limits

__all__ = ["INTERNAL_PREFIX", "InternalListener", "StartExtra", "internal_tls", "without_internal"]

INTERNAL_PREFIX = "/internal/"

# Started with the server: its state (connections, tasks) and the app's; the servers it opened.
StartExtra = Callable[[ServerState, dict[str, Any]], Awaitable[list[asyncio.Server]]]


def internal_tls(http: HttpSettings) -> ssl.SSLContext | None:
    """The internal listener's TLS context (``internal_cert``), or None for plain HTTP.

    Raises:
        ConfigError: a certificate, key or CA file that cannot be read or does not match.
    """
    if http.internal_cert is None or http.internal_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(http.internal_cert, http.internal_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"internal_cert, internal_key: {http.internal_cert} and {http.internal_key} are not a PEM"
            f" certificate and its private key ({exc})"
        ) from exc
    if http.replica_ca is not None and http.internal_verify_clients:
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_verify_locations(cafile=http.replica_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"replica_ca: {http.replica_ca} is not a readable PEM file of CA certificates ({exc})"
            ) from exc
    return context


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":  # (lifespan: the public app's runs)
        return
    await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


def without_internal(app: ASGIApp) -> ASGIApp:
    """``app`` answering 404 under ``/internal/``: the public port, when the internal listener serves that."""

    async def public(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(INTERNAL_PREFIX):
            await _not_found(scope, receive, send)
        else:
            await app(scope, receive, send)

    return public


@dataclass(frozen=True)
class InternalListener:
    """The internal port's sockets, and what serves them: ``route(fallback)`` answers ``/internal/``
    and hands the rest to ``fallback`` (here: 404)."""

    http: HttpSettings
    log_level: str
    route: Callable[[ASGIApp], ASGIApp]
    sockets: list[socket.socket]
    tls: ssl.SSLContext | None

    async def start(self, state: ServerState, app_state: dict[str, Any]) -> list[asyncio.Server]:
        """Serve the sockets beside the public ones (``state``: the public server's, shared)."""
        http = self.http
        app = SlowBodyGuard(self.route(_not_found), http.body_timeout, http.body_min_rate)
        config = uvicorn.Config(
            app,
            log_level=self.log_level.lower(),
            lifespan="off",
            server_header=False,
            **uvicorn_limits(http),
        )
        config.load()
        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.Protocol:
            made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=state, app_state=app_state, _loop=loop
            )
            return made

        return [
            await loop.create_server(protocol, sock=sock, ssl=self.tls, backlog=config.backlog) for sock in self.sockets
        ]
