"""Scratch workspaces: a directory in ``runs/`` for a run (or a long-lived sandbox) without a conversation.

Only for backends that cannot size a scratch workspace themselves (``sized_scratch`` false: the
container backends, where ``/workspace`` and ``/data`` must be one bound directory); bwrap gives
such a run a tmpfs instead, and :mod:`.disk` watches these directories while the run writes.

Each is the sandbox uid's, lives as long as its sandbox and is removed after it, off the event
loop and shielded from cancellation. Those a server left when it died (named after its pid,
see :mod:`mcp_sandbox.state`) are swept by the next server to start.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread

from mcp_sandbox.config import SandboxSettings
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace.removal import remove_tree

__all__ = ["remove_shielded", "scratch_workspace", "sweep_scratch"]

logger = logging.getLogger(__name__)


async def remove_shielded(directory: Path) -> None:
    """Remove ``directory`` in a worker thread, even when cancelled; log (not raise) a failure."""
    with anyio.CancelScope(shield=True):
        try:
            await anyio.to_thread.run_sync(remove_tree, directory)
        except OSError as exc:
            logger.error("could not remove %s: %s", directory, exc)


@contextlib.asynccontextmanager
async def scratch_workspace(
    layout: StateLayout, sandbox: SandboxSettings, uid: int | None = None
) -> AsyncIterator[Path]:
    """A fresh workspace for one run (or session) under ``layout``, owned by the sandbox's host uid, removed after.

    ``uid``: that host uid, its tenant's (None: ``sandbox.sandbox_uid``).

    Raises:
        OSError: it cannot be created.
    """
    layout.prepare_runs()
    directory = layout.new_scratch()
    try:
        if os.geteuid() == 0:
            owner = sandbox.sandbox_uid if uid is None else uid
            os.chown(directory, owner, sandbox.sandbox_gid)
        yield directory
    finally:
        # Off the event loop: a run may leave a million files behind.
        await remove_shielded(directory)


def sweep_scratch(layout: StateLayout) -> int:
    """Remove scratch workspaces (and session tool views) left by servers that died; return how many.

    Only a dead server's are touched, even when several servers share a state directory.

    Raises:
        OSError: ``runs/`` cannot be listed (call :meth:`StateLayout.prepare_runs` first).
    """
    removed = 0
    for directory in layout.stale_runs():
        try:
            remove_tree(directory)
        except OSError as exc:
            logger.warning("could not remove the stale workspace %s: %s", directory, exc)
            continue
        removed += 1
    return removed
