"""What uploads and forks cut short by a crash left behind, swept at start; and the walks' bounds.

Call the sweep at start: a live server's uploads in ``uploads/`` are never touched (their names
start with its pid), a fork's directory is removed only when its server's pid is gone, and this
version writes no partial file into a workspace (older versions did, next to the file).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace.cloning import FORK_PREFIX
from mcp_sandbox.workspace.files import Walk, open_parent
from mcp_sandbox.workspace.names import RESERVED_PREFIX
from mcp_sandbox.workspace.removal import remove_tree

__all__ = ["MAX_DEPTH", "MAX_LIST_ENTRIES", "sweep_partials"]

MAX_LIST_ENTRIES = 100_000
MAX_DEPTH = 64
# How versions before uploads/ named a partial upload, in the directory of the file it was for.
_OLD_PARTIAL = RESERVED_PREFIX + "upload-"


def sweep_partials(
    layout: StateLayout, workspaces: Path, keys: Iterable[str], open_root: Callable[[str], int | None]
) -> int:
    """Delete dead servers' files in ``uploads/``, their forks and checkpoints cut short, and older versions' partial
    files in the conversations ``keys`` (``open_root``: a conversation's directory fd, or None);
    return how many were deleted."""
    removed = 0
    for entry in layout.stale_uploads():
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed += 1
    staged = list(workspaces.glob(FORK_PREFIX + "*")) if workspaces.is_dir() else []
    if layout.checkpoints.is_dir():  # and checkpoints' copies (workspace/checkpoints.py)
        staged += layout.checkpoints.glob(f"*/{FORK_PREFIX}*")
    for entry in staged:
        pid = entry.name.removeprefix(FORK_PREFIX).partition("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():  # a fork its server's crash cut short
            with contextlib.suppress(OSError):
                remove_tree(entry)
                removed += 1
    for key in keys:
        root = open_root(key)
        if root is None:
            continue
        try:
            walk = Walk(root, max_depth=MAX_DEPTH, max_entries=MAX_LIST_ENTRIES, servable_only=False)
            for parts in [parts for parts, _ in walk if parts[-1].startswith(_OLD_PARTIAL)]:
                parent = open_parent(root, "/".join(parts))
                try:
                    os.unlink(parts[-1], dir_fd=parent)
                    removed += 1
                finally:
                    os.close(parent)
        except (OSError, WorkspaceError):
            continue  # changed meanwhile, or unreadable: the next start looks again
        finally:
            os.close(root)
    return removed
