"""Serving one run's egress proxy on a Unix socket, in a directory bound into its sandbox.

:func:`serve_egress` listens for the block of a run and hands each connection to an
:class:`~.proxy.EgressProxy`; :func:`socket_directory` makes a directory for a long-lived
sandbox (a session's), whose socket comes and goes with each of its runs. The socket and its
directory are the sandbox's uid's to reach when the server runs as root, the server's alone
otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
from anyio.abc import SocketListener

from mcp_sandbox.audit import AuditLog
from mcp_sandbox.egress.proxy import EgressProxy
from mcp_sandbox.egress.resolve import Resolver, system_resolver
from mcp_sandbox.egress.rules import EgressGrant
from mcp_sandbox.events import Observer, unheard

if TYPE_CHECKING:
    from mcp_sandbox.egress.authority import Authority

__all__ = ["BUNDLE_FILE", "CA_FILE", "SOCKET_NAME", "remove_socket_directory", "serve_egress", "socket_directory"]

logger = logging.getLogger(__name__)

SOCKET_NAME = "proxy.sock"
CA_FILE = "egress-ca.pem"  # the CA's certificate alone (NODE_EXTRA_CA_CERTS, DENO_CERT)
BUNDLE_FILE = "ca-bundle.pem"  # the host's roots and the CA (SSL_CERT_FILE and the rest)
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes


def _socket_directory(runs: Path, group: int | None) -> Path:
    """A new directory for the socket: under ``runs`` unless that path is too long for a socket."""
    name = f"{os.getpid()}-egress-{uuid.uuid4().hex[:12]}"
    if len(str(runs / name / SOCKET_NAME)) <= _MAX_SOCKET_PATH:
        directory = runs / name
        directory.mkdir(mode=0o700)
    else:
        directory = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-egress-"))
    if group is not None:
        os.chown(directory, -1, group)
        directory.chmod(0o710)
    return directory


def _listening(path: Path) -> socket.socket:
    """A Unix socket listening at ``path`` (a stale socket there removed), made on the event loop.

    Not ``anyio.create_unix_listener``, which binds in a worker thread: a few syscalls on a local
    directory do not block, and the thread's round trip lands on the first run with network.
    """
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            path.unlink()
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listening.setblocking(False)
        listening.bind(os.fspath(path))
        listening.listen(socket.SOMAXCONN)
    except OSError:
        listening.close()
        raise
    return listening


@contextlib.asynccontextmanager
async def serve_egress(
    runs: Path,
    grant: EgressGrant,
    audit: AuditLog | None,
    *,
    resolver: Resolver = system_resolver,
    group: int | None = None,
    directory: Path | None = None,
    emit: Observer = unheard,
    authority: Authority | None = None,
) -> AsyncIterator[tuple[EgressProxy, Path]]:
    """Serve a run's proxy on a fresh Unix socket for this block; yield it and the socket's directory.

    ``group``: the host gid the sandbox runs as, given the directory and socket (the server runs
    as root and the sandbox as another uid); None when the sandbox runs as the server's own uid.
    ``directory``: an existing one (a session's, bound into its sandbox for life: only the socket
    comes and goes with each run), else a new one under ``runs``, removed afterwards.
    ``emit``: hears each connection's end (see :class:`EgressProxy`).
    ``authority``: the CA of the hosts a secret goes to; where the grant holds secrets, its
    certificate is written beside the socket (:data:`CA_FILE`, and :data:`BUNDLE_FILE` with the
    host's roots) for the sandbox to trust.

    Raises:
        OSError: the directory or the socket cannot be made.
    """
    owned = directory is None
    if directory is None:
        directory = _socket_directory(runs, group)
    proxy = EgressProxy(grant, audit, resolver, emit, authority)
    try:
        if authority is not None and grant.secrets:
            await anyio.to_thread.run_sync(_write_trust, directory, authority)
        path = directory / SOCKET_NAME
        listener = await SocketListener.from_socket(_listening(path))
        try:
            if group is not None:
                os.chown(path, -1, group)
                path.chmod(0o660)
            else:
                path.chmod(0o600)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(listener.serve, proxy.handle, tasks)
                try:
                    yield proxy, directory
                finally:
                    tasks.cancel_scope.cancel()
        finally:
            try:
                proxy.summarize()  # its connections are all done: the tasks above have ended
            except OSError as exc:
                logger.error("egress proxy: cannot write the audit log: %s", exc)
            with anyio.CancelScope(shield=True):
                await listener.aclose()
    finally:
        if owned:
            remove_socket_directory(directory)
        else:
            with contextlib.suppress(OSError):
                (directory / SOCKET_NAME).unlink()


def _write_trust(directory: Path, authority: Authority) -> None:
    for name, data in ((CA_FILE, authority.trusted()), (BUNDLE_FILE, authority.bundle())):
        temporary = directory / f".{name}.{uuid.uuid4().hex[:8]}"
        temporary.write_bytes(data)
        temporary.chmod(0o644)
        temporary.replace(directory / name)  # a session's sandbox may be reading the old one


def remove_socket_directory(directory: Path) -> None:
    """Remove a socket directory: the socket, the trust files (a run with secrets) and the directory."""
    for name in (SOCKET_NAME, CA_FILE, BUNDLE_FILE):
        with contextlib.suppress(OSError):
            (directory / name).unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()


def socket_directory(runs: Path, group: int | None) -> Path:
    """A new directory for a long-lived sandbox's proxy socket (see :func:`serve_egress`); the caller removes it
    (:func:`remove_socket_directory`).

    Raises:
        OSError: it cannot be made.
    """
    return _socket_directory(runs, group)
