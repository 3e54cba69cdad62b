"""Per-run aliases of a container's bind sources, so that its command line names no workspace.

A ``podman run`` / ``docker run`` client's argv is in the host's process list, readable by every
local user while the run lasts; a workspace's path there names its key (a keyed hash of tenant
and conversation), as the library's and scratch directories name theirs. (bwrap takes its
arguments through a descriptor instead; the container CLIs have no such option.) So each
container's binds go through symlinks in a fresh directory of its own under the state
directory's ``runs/`` (``<pid>-alias-<hex>``, mode 0700, the server's: no other host user may
look inside), named ``0``, ``1``, ...: the engine resolves them as it mounts, and the command
line shows only ``runs/<pid>-alias-<hex>/<n>``. The directory goes when the container does (and
with the dead server's other entries, see ``StateLayout.stale_runs``).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
from pathlib import Path

from mcp_sandbox.sandbox.policy import SandboxPolicy
from mcp_sandbox.state import StateLayout

__all__ = ["alias_binds", "remove_aliases"]


def alias_binds(policy: SandboxPolicy, layout: StateLayout) -> tuple[SandboxPolicy, Path]:
    """``policy`` with its workspace and every bound (non-system) source replaced by an alias; their directory.

    Raises:
        OSError: the directory or a link cannot be made.
    """
    directory = layout.prepare_runs() / f"{os.getpid()}-alias-{secrets.token_hex(8)}"
    directory.mkdir(mode=0o700)
    try:
        count = 0

        def alias(source: Path) -> Path:
            nonlocal count
            link = directory / str(count)
            count += 1
            link.symlink_to(source)
            return link

        mounts = tuple(
            mount if mount.system else dataclasses.replace(mount, source=alias(mount.source)) for mount in policy.mounts
        )
        workspace = alias(policy.workspace) if policy.workspace is not None else None
    except OSError:
        remove_aliases(directory)
        raise
    return dataclasses.replace(policy, mounts=mounts, workspace=workspace), directory


def remove_aliases(directory: Path) -> None:
    """Remove a directory :func:`alias_binds` made (the links only: never what they point to)."""
    shutil.rmtree(directory, ignore_errors=True)
