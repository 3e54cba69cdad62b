"""How a container's channel reaches the host: an fd placed for ``--preserve-fds`` (podman), or a
unix socket the container connects to (docker; see ``argv.py``)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from mcp_sandbox.sandbox.backends.container.argv import CHANNEL_FD

__all__ = ["accept", "listen", "place_fd"]

_CONNECT_SECONDS = 30.0


def place_fd(fd: int | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` putting ``fd`` at :data:`CHANNEL_FD`, where ``--preserve-fds`` takes it."""
    if fd is None:
        return None

    def place() -> None:
        if fd != CHANNEL_FD:
            os.dup2(fd, CHANNEL_FD)

    return place


def listen(directory: Path, user: tuple[int, int]) -> socket.socket:
    """A socket listening in ``directory`` (fresh, ours), which only ``user`` (the container's
    ids) and root may then enter."""
    if os.geteuid() == 0:
        os.chown(directory, user[0], user[1])
    with contextlib.ExitStack() as undo:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        undo.callback(listener.close)
        listener.bind(str(directory / "channel.sock"))
        if os.geteuid() == 0:
            os.chown(directory / "channel.sock", user[0], user[1])
        listener.listen(1)
        listener.setblocking(False)
        undo.pop_all()
    return listener


async def accept(listener: socket.socket, ended: Callable[[], Awaitable[object]]) -> socket.socket | None:
    """Wait for the container's one connection, or for ``ended`` (its end), for a bound; then stop
    listening. None when it did not connect."""
    connected: socket.socket | None = None
    try:
        with anyio.move_on_after(_CONNECT_SECONDS):
            async with anyio.create_task_group() as group:

                async def connect() -> None:
                    nonlocal connected
                    while connected is None:
                        await anyio.wait_readable(listener)
                        with contextlib.suppress(BlockingIOError):  # another wake-up took it
                            connected, _ = listener.accept()
                    group.cancel_scope.cancel()

                async def end() -> None:
                    await ended()
                    group.cancel_scope.cancel()

                group.start_soon(connect)
                group.start_soon(end)
    except BaseException:  # cancelled, perhaps just after the container connected
        if connected is not None:
            connected.close()
        raise
    finally:
        listener.close()
    if connected is not None:
        connected.setblocking(True)
    return connected
