"""A sandbox's ``/tools``: a host directory of links to the stubs of the current run's servers.

A long-lived sandbox (a session's, a warm or pre-started one) cannot get new bind mounts, so it
binds the stub root (``StateLayout.stubs``) at ``/.stubs`` and this directory at ``/tools``, in
which the host points ``/tools/<alias>`` at the stubs of the current run's servers before each run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.to_thread

from mcp_sandbox.sandbox.policy import TOOLS_MOUNT, Mount
from mcp_sandbox.state import StateLayout

__all__ = ["STUBS_MOUNT", "ToolsView"]

STUBS_MOUNT = "/.stubs"


class ToolsView:
    """A long-lived sandbox's ``/tools``: a host directory of symlinks to the stubs of the current run's servers.

    The directory is the server's own (0755, bound read-only). A stub tree under the stub root
    is reached through ``/.stubs``; one elsewhere is copied into the directory once.
    """

    def __init__(self, directory: Path, stub_root: Path) -> None:
        self.directory = directory
        self.stub_root = stub_root
        self.empty = True  # it shows no stubs (new, or its last bind had none): binding none is a no-op

    @classmethod
    def create(cls, layout: StateLayout) -> ToolsView:
        """A new, empty view in ``layout.runs`` (named after this server's pid, so a sweep finds it).

        Raises:
            OSError: it cannot be created (``runs/`` must exist).
        """
        stub_root = layout.prepare_stubs()
        return cls(layout.new_tools_view(), stub_root)

    def mounts(self) -> tuple[Mount, ...]:
        """What the sandbox binds: the stub root and this directory."""
        return (Mount(self.stub_root, STUBS_MOUNT), Mount(self.directory, TOOLS_MOUNT))

    def bind(self, mounts: Sequence[Mount]) -> None:
        """Make ``/tools/<alias>`` show each of ``mounts`` (targets ``/tools/<alias>``), and nothing else.

        Raises:
            ValueError: a mount's target is not a directory directly under ``/tools``.
            OSError: the directory cannot be written.
        """
        wanted: dict[str, str] = {}
        for mount in mounts:
            alias = mount.target.removeprefix(TOOLS_MOUNT + "/")
            if alias == mount.target or not alias or "/" in alias or alias.startswith("."):
                raise ValueError(f"a session can only show stubs under {TOOLS_MOUNT}/<alias>, not at {mount.target}")
            wanted[alias] = self._inside(mount.source)
        in_use = {target.removeprefix(TOOLS_MOUNT + "/") for target in wanted.values()}
        for entry in os.listdir(self.directory):
            if not entry.startswith(".") and entry not in wanted:
                os.unlink(self.directory / entry)
            elif entry.startswith(".copy-") and entry not in in_use:
                # A copy an earlier run wanted: gone before this run, which may be another
                # tenant's (a warm sandbox serves any), can see it.
                shutil.rmtree(self.directory / entry)
        for alias, target in wanted.items():
            link = self.directory / alias
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            # A new symlink renamed over the old one: a run never sees /tools/<alias> missing.
            scratch = self.directory / f".{alias}-{uuid.uuid4().hex}"
            os.symlink(target, scratch)
            os.rename(scratch, link)
        self.empty = not wanted

    async def show(self, mounts: Sequence[Mount]) -> None:
        """:meth:`bind` in a worker thread, or nothing at all when there is nothing to change (a run without tools).

        Raises:
            ValueError: a mount's target is not a directory directly under ``/tools``.
            OSError: the directory cannot be written.
        """
        if mounts or not self.empty:
            await anyio.to_thread.run_sync(self.bind, mounts)

    def _inside(self, source: Path) -> str:
        """Where ``source`` is seen inside the sandbox."""
        resolved, root = source.resolve(), self.stub_root.resolve()
        if resolved.is_relative_to(root) and resolved != root:
            return f"{STUBS_MOUNT}/{resolved.relative_to(root)}"
        copy = self.directory / f".copy-{hashlib.sha256(str(resolved).encode()).hexdigest()[:16]}"
        if not copy.exists():
            shutil.copytree(resolved, copy, symlinks=True)
            for directory, _, files in os.walk(copy):
                os.chmod(directory, 0o755)
                for name in files:
                    os.chmod(os.path.join(directory, name), 0o644)
        return f"{TOOLS_MOUNT}/{copy.name}"
