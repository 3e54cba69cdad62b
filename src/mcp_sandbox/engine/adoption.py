"""Adoption: a session-ready sandbox's slot becomes a conversation's directory, in a few renames.

A bind follows the directory, not its path: the conversation's entries move into the slot and the
slot is renamed over the conversation's (now empty) directory (:func:`adopt`); on failure every
entry goes back (merging into what appeared meanwhile). Used by :mod:`.ready`.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["SplitAdoptionError", "adopt", "few_entries"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FEW_ENTRIES = 32  # a conversation with at most this many top-level entries is adopted on the event loop


def adopt(slot: Path, workspace: Path) -> None:
    """Make ``slot`` the conversation's directory at ``workspace``: move its entries in, rename it over.

    The caller holds the conversation's change lock (:mod:`~mcp_sandbox.workspace.changes`), so
    no upload lands meanwhile. O(top-level entries): each entry is one rename (never followed,
    never copied); the empty directory left is then replaced by ``slot`` in one rename. On any
    failure every entry moved goes back (:func:`_move_back`) and the error is raised.

    Raises:
        OSError: the two are not on one filesystem, or an entry could not be moved.
        SplitAdoptionError: not every entry could be moved back; what is left is in ``slot``.
    """
    source = os.open(workspace, _DIRECTORY)
    target = os.open(slot, _DIRECTORY)
    try:
        try:
            _move_entries(source, target)
            os.rename(slot, workspace)
        except OSError:
            try:
                _move_back(target, source)
            except OSError as exc:
                raise SplitAdoptionError(f"entries of {workspace} are left in {slot}: {exc}") from exc
            raise
    finally:
        os.close(source)
        os.close(target)


class SplitAdoptionError(OSError):
    """A failed adoption could not move every entry back: the slot must be kept, its sandbox destroyed."""


def few_entries(directory: Path) -> bool:
    """Whether ``directory`` holds at most ``_FEW_ENTRIES`` entries (False if it cannot be listed)."""
    try:
        with os.scandir(directory) as listing:
            return sum(1 for _ in itertools.islice(listing, _FEW_ENTRIES + 1)) <= _FEW_ENTRIES
    except OSError:
        return False


def _names(directory: int) -> list[str]:
    with os.scandir(directory) as listing:
        return [entry.name for entry in listing]


def _move_entries(source: int, target: int) -> None:
    for name in _names(source):
        os.rename(name, name, src_dir_fd=source, dst_dir_fd=target)


def _move_back(slot: int, workspace: int) -> None:
    """Move every entry of ``slot`` back into ``workspace``, merging into what appeared there meanwhile.

    A directory that came back meanwhile (an upload that went around the change lock recreating
    ``d3/``) is merged into, entry by entry; an entry whose name is taken by one of another kind
    comes back under a free name (``name.restored``, ``name.restored-2``, ...). Only an I/O
    error leaves anything in the slot (raised).
    """
    for name in _names(slot):
        try:
            os.rename(name, name, src_dir_fd=slot, dst_dir_fd=workspace)
            continue
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
                raise
        mine = os.stat(name, dir_fd=slot, follow_symlinks=False)
        theirs = os.stat(name, dir_fd=workspace, follow_symlinks=False)
        if stat.S_ISDIR(mine.st_mode) and stat.S_ISDIR(theirs.st_mode):
            inner_slot = os.open(name, _DIRECTORY, dir_fd=slot)
            try:
                inner = os.open(name, _DIRECTORY, dir_fd=workspace)
                try:
                    _move_back(inner_slot, inner)
                finally:
                    os.close(inner)
            finally:
                os.close(inner_slot)
            os.rmdir(name, dir_fd=slot)
            continue
        free = next(
            f"{name}.restored{suffix}" for suffix in _suffixes() if not _exists(workspace, f"{name}.restored{suffix}")
        )
        os.rename(name, free, src_dir_fd=slot, dst_dir_fd=workspace)


def _suffixes() -> Iterator[str]:
    yield ""
    for number in itertools.count(2):
        yield f"-{number}"


def _exists(directory: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
