"""Taking over a delegated cgroup v2 subtree: our processes into a leaf, controllers on for siblings.

cgroup v2's "no internal processes" rule: a cgroup that holds processes cannot enable
controllers for its children (``cgroup.subtree_control`` answers EBUSY). A freshly delegated
scope holds the server itself, so the server first moves every process of the scope into a
leaf child (``mcp-sandbox-server``), then enables ``memory pids cpu`` in the scope; each
sandbox's cgroup is then a sibling of that leaf (see ``run.py``)::

    <scope>/                      delegated to us; subtree_control: +memory +pids +cpu
    ├── mcp-sandbox-server/       the server (and what it spawns outside sandboxes)
    └── mcp-sandbox-<pid>-<hex>/  one per sandbox, with its limits

Writing a pid into a ``cgroup.procs`` needs write access to the common ancestor's
``cgroup.procs`` too, which a delegation gives us for the scope.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

__all__ = ["LEAF", "adopt", "into_leaf", "is_delegated_to_us", "marked_delegated"]

LEAF = "mcp-sandbox-server"
_MOVE_ROUNDS = 50  # processes may fork while we move them; each round moves what is left


def marked_delegated(directory: Path) -> bool:
    """Whether systemd (>= 251) marked ``directory`` as delegated (``trusted.``/``user.delegate`` = 1)."""
    for name in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(directory, name).strip() in (b"1", b"yes", b"true"):
                return True
    return False


def is_delegated_to_us(directory: Path) -> bool:
    """Whether we may manage ``directory``: we can create children and move processes and
    enable controllers there (what a ``Delegate=yes`` unit's cgroup gives its user)."""
    return all(
        os.access(path, os.W_OK)
        for path in (directory, directory / "cgroup.procs", directory / "cgroup.subtree_control")
    )


def into_leaf(base: Path) -> Path:
    """Move every process of ``base`` into its leaf child (made if missing); return the leaf.

    Raises:
        OSError: a move was refused (not ESRCH: a process that died meanwhile is fine), or
            processes kept appearing.
    """
    leaf = base / LEAF
    with contextlib.suppress(FileExistsError):
        leaf.mkdir()
    procs = leaf / "cgroup.procs"
    for _ in range(_MOVE_ROUNDS):
        pids = (base / "cgroup.procs").read_text().split()
        if not pids:
            return leaf
        for pid in pids:
            try:
                procs.write_text(pid)
            except ProcessLookupError:
                continue
    raise OSError(errno.EBUSY, f"processes keep appearing in {base}")


def adopt(base: Path, controllers: tuple[str, ...]) -> set[str]:
    """Move ``base``'s processes into its leaf and enable ``controllers`` (those available) for
    its children; return the controllers enabled in ``base/cgroup.subtree_control``.

    Idempotent: a second server in the same delegated cgroup finds the leaf and the
    controllers there already.

    Raises:
        OSError: the cgroup filesystem refused (not ours, or processes we cannot move).
    """
    available = set((base / "cgroup.controllers").read_text().split())
    wanted = [c for c in controllers if c in available]
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    if not wanted or set(wanted) <= enabled:
        return enabled & set(controllers)
    into_leaf(base)
    for controller in wanted:
        if controller not in enabled:
            (base / "cgroup.subtree_control").write_text(f"+{controller}")
    return set((base / "cgroup.subtree_control").read_text().split()) & set(controllers)
