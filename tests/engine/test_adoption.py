"""A born session's adoption of a conversation's directory, and its rollback, on the real filesystem.

The rollback must put every entry back, merging into what appeared meanwhile: files split
between the conversation's directory and a sandbox's slot were how one conversation's files
showed in the next new conversation (issue 43).
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.engine.adoption import _move_back, adopt

_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_IMMUTABLE = 0x10


def _tree(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): path.read_text() for path in sorted(root.rglob("*")) if path.is_file()}


def test_adoption_moves_every_entry_and_the_slot_becomes_the_conversations_directory(tmp_path: Path) -> None:
    workspace, slot = tmp_path / "conversation", tmp_path / "slot"
    workspace.mkdir()
    slot.mkdir()
    for index in range(50):
        (workspace / f"d{index}").mkdir()
        (workspace / f"d{index}" / "f").write_text(str(index))
    before = _tree(workspace)
    slot_inode = slot.stat().st_ino

    adopt(slot, workspace)

    assert workspace.stat().st_ino == slot_inode and not slot.exists()
    assert _tree(workspace) == before


def test_a_rollback_merges_into_folders_that_came_back_and_keeps_both_of_a_taken_name(tmp_path: Path) -> None:
    workspace, slot = tmp_path / "conversation", tmp_path / "slot"
    for path in (workspace / "d3", workspace / "x", slot / "d3" / "deep"):
        path.mkdir(parents=True)
    (workspace / "d3" / "u1").write_text("uploaded meanwhile")
    (workspace / "x" / "z").write_text("a folder where a file was")
    (slot / "d3" / "f").write_text("moved")
    (slot / "d3" / "deep" / "g").write_text("deeper")
    (slot / "x").write_text("the file")
    (slot / "y").write_text("plain")

    source, target = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY), os.open(slot, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _move_back(target, source)
    finally:
        os.close(source)
        os.close(target)

    assert list(slot.iterdir()) == []
    assert _tree(workspace) == {
        "d3/deep/g": "deeper",
        "d3/f": "moved",
        "d3/u1": "uploaded meanwhile",
        "x.restored": "the file",
        "x/z": "a folder where a file was",
        "y": "plain",
    }


@contextlib.contextmanager
def _immutable(path: Path) -> Iterator[None]:
    """``path`` immutable for the block (rename refuses it with EPERM, even root's); skips where unsupported."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        flags = array.array("l", [0])
        try:
            fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, array.array("l", [flags[0] | _IMMUTABLE]))
        except OSError as exc:
            pytest.skip(f"cannot make a file immutable here: {exc.strerror}")
        try:
            yield
        finally:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags)
    finally:
        os.close(fd)


def test_an_adoption_that_fails_half_way_leaves_every_entry_in_the_conversation(tmp_path: Path) -> None:
    workspace, slot = tmp_path / "conversation", tmp_path / "slot"
    workspace.mkdir()
    slot.mkdir()
    for index in range(50):
        (workspace / f"e{index}").write_text(str(index))
    before = _tree(workspace)
    stuck = sorted(workspace.iterdir())[25]
    with _immutable(stuck):
        with pytest.raises(OSError) as raised:
            adopt(slot, workspace)
        assert raised.value.errno == errno.EPERM
    assert list(slot.iterdir()) == []
    assert _tree(workspace) == before
