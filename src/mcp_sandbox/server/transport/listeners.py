"""The HTTP server's listening sockets, bound at the very start: a port in use is said at once.

Kept free of heavy imports (no uvicorn, no MCP SDK): the CLI binds before it imports the server,
so a busy port is one line within a second, not an error at the end of the service's start.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

from mcp_sandbox.config import HttpSettings
from mcp_sandbox.config.server_pieces import check_internal_listener
from mcp_sandbox.errors import ConfigError

__all__ = ["Listeners", "bind_listeners"]


@dataclass(frozen=True)
class Listeners:
    """The public sockets (clients, the balancer) and the internal ones (``internal_port``: the
    replicas' ``/internal/`` routes; none when unset)."""

    public: list[socket.socket]
    internal: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for listener in (*self.public, *self.internal):
            listener.close()


def _bind(host: str, port: int, setting: str) -> list[socket.socket]:
    bound: list[socket.socket] = []
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _name, address in dict.fromkeys(found):
            listener = socket.socket(family, kind, proto)
            bound.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio's create_server: each family its own socket
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind(address)
    except OSError as exc:
        for listener in bound:
            listener.close()
        reason = exc.strerror or str(exc)
        hint = f" (another server on it? choose another with {setting})" if exc.errno == errno.EADDRINUSE else ""
        raise ConfigError(f"cannot listen on {host}:{port}: {reason.lower()}{hint}") from exc
    return bound


def bind_listeners(http: HttpSettings, replica_url: str | None) -> Listeners:
    """The sockets :func:`serve_http` will listen on, bound now, before the service opens.

    A port in use is then said at once, in one line, not seconds later inside the service's
    closing. Bound, not listening: a connection is refused until the server serves, as before.
    Every address ``http.host`` resolves to (``localhost``: both families), as uvicorn binds them;
    with ``internal_port``, those of ``internal_host`` (else ``host``) on that port too.

    Raises:
        ConfigError: an address cannot be bound (in use, not this host's, not permitted), or the
            internal listener's settings do not fit.
    """
    check_internal_listener(http, replica_url)  # (before binding: the public port twice would bind, then not listen)
    public = _bind(http.host, http.port, "--port")
    if http.internal_port is None:
        return Listeners(public)
    try:
        internal = _bind(http.internal_host or http.host, http.internal_port, "internal_port")
    except ConfigError:
        for listener in public:
            listener.close()
        raise
    return Listeners(public, internal)
