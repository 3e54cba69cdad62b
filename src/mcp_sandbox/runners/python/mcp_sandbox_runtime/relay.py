"""The relay to the host's egress proxy, and the workspace's own packages on ``sys.path``.

A sandbox granted network has no interface but loopback. When ``MCP_SANDBOX_EGRESS_SOCKET``
names the proxy's Unix socket (bound in by the host), :func:`start` listens on
``MCP_SANDBOX_EGRESS_RELAY`` (an address on the sandbox's loopback, where ``HTTP_PROXY`` and
friends point) and copies every connection to that socket and back, in daemon threads, for as
long as the runner lives. The relay decides nothing: the proxy on the host checks every request.

``pip install`` in such a run puts packages in ``PIP_TARGET`` (in the conversation's workspace);
:func:`add_packages` puts that directory on ``sys.path`` of every run, after the runtime's own.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import sys
import threading

__all__ = ["PACKAGES", "add_packages", "start"]

PACKAGES = "/workspace/.packages/python"
_CHUNK = 64 << 10


def add_packages(*, invalidate: bool = True) -> None:
    """Put the workspace's packages on ``sys.path`` (after the runtime's) and forget what was not found before.

    ``invalidate=False`` where no import can have looked there yet (a process before its first
    run): forgetting then only makes the run's imports list every directory on ``sys.path`` again.
    """
    if PACKAGES not in sys.path:
        sys.path.append(PACKAGES)
    if invalidate:
        importlib.invalidate_caches()  # a `pip install` in an earlier run of this session made it exist


def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(_CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _serve(client: socket.socket, path: str) -> None:
    with contextlib.suppress(OSError):  # no Nagle delay on what goes back to the client
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
        try:
            upstream.connect(path)
        except OSError:
            return
        back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
        back.start()
        _copy(client, upstream)
        back.join()


def _accept(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve, args=(client, path), daemon=True).start()


def start() -> str | None:
    """Start the relay if this sandbox has network; None, or why it could not start."""
    path = os.environ.get("MCP_SANDBOX_EGRESS_SOCKET")
    address = os.environ.get("MCP_SANDBOX_EGRESS_RELAY")
    if not path or not address:
        return None
    host, _, port = address.rpartition(":")
    try:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
        listener.listen(64)
    except (OSError, ValueError) as exc:
        return f"the network relay did not start: {exc}"
    threading.Thread(target=_accept, args=(listener, path), name="mcp-sandbox-egress-relay", daemon=True).start()
    return None
