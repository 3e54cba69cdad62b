"""remove_tree deletes whatever a sandbox left behind, without recursion or following links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_sandbox.workspace import remove_tree


@pytest.mark.slow  # thousands of nested directories: seconds on a busy machine
def test_a_tree_deeper_than_path_max_and_the_recursion_limit_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(3000):  # 3000 levels of "d/" is 6000 bytes: past PATH_MAX (4096)
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)

    remove_tree(root)

    assert not root.exists()


def test_symlinks_are_removed_and_their_targets_survive(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "to-dir").symlink_to(outside)
    (root / "sub" / "to-file").symlink_to(outside / "keep.txt")

    remove_tree(root)

    assert not root.exists()
    assert (outside / "keep.txt").read_text() == "precious"


def test_directories_the_code_closed_with_chmod_000_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "locked" / "inner").mkdir(parents=True)
    (root / "locked" / "inner" / "file").write_text("x")
    (root / "locked" / "inner").chmod(0)
    (root / "locked").chmod(0)
    root.chmod(0)

    remove_tree(root)

    assert not root.exists()


def test_a_missing_root_is_not_an_error(tmp_path: Path) -> None:
    remove_tree(tmp_path / "never-made")

    assert not (tmp_path / "never-made").exists()
