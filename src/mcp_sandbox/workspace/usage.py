"""What a conversation's quota counts: its files, its parked interpreter state and its checkpoints.

``st_size`` (not allocated blocks) is what users see in listings; a sparse file counts at its
full size. Files the listing hides (odd names, closed directories) count too. The parked state
(``engine/parking.py``: the one parked beside the conversation, and the one its live session
resumed and holds) and the checkpoints (:mod:`.checkpoints`) are not files of the workspace but
take the same disk, so they count against the same quota.
"""

from __future__ import annotations

import os

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace.checkpoints import checkpoint_bytes
from mcp_sandbox.workspace.files import Usage, Walk
from mcp_sandbox.workspace.partials import MAX_DEPTH, MAX_LIST_ENTRIES

__all__ = ["measure_usage"]


def measure_usage(layout: StateLayout, key: str, root: int | None, quota_files: int) -> Usage:
    """What conversation ``key``'s quota counts, its workspace open at directory fd ``root`` (None:
    there is none yet); every regular file is walked, at most twice ``quota_files`` of them.

    Raises:
        WorkspaceError: the workspace directory cannot be read.
    """
    parked = _parked_bytes(layout, key) + checkpoint_bytes(layout, key, quota_files)
    if root is None:
        return Usage(bytes=parked, files=0)
    total, files = parked, 0
    try:
        bound = max(MAX_LIST_ENTRIES, 2 * quota_files)
        walk = Walk(root, max_depth=MAX_DEPTH, max_entries=bound, servable_only=False)
        for _, info in walk:
            total += info.st_size
            files += 1
    except OSError as exc:  # the top directory itself (the code may chmod /workspace)
        raise WorkspaceError(f"the conversation's workspace cannot be read: {exc.strerror}") from exc
    return Usage(bytes=total, files=files, complete=walk.complete)


def _parked_bytes(layout: StateLayout, key: str) -> int:
    """The size of conversation ``key``'s parked interpreter state, and of the one its live session
    resumed and holds, 0 if none (``key`` already checked by the caller).

    Raises:
        WorkspaceError: a state is there but cannot be measured.
    """
    total = 0
    for path in (layout.parked_state(key), layout.held_state(key)):
        try:
            total += os.lstat(path).st_size
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise WorkspaceError(f"the conversation's parked state cannot be measured: {exc.strerror}") from exc
    return total
