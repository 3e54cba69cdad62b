"""kernfs: the small-file helpers the server uses on every sandbox's cgroup and /proc files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_sandbox.sandbox import kernfs


def test_read_returns_a_file_longer_than_one_read_whole(tmp_path: Path) -> None:
    text = "".join(f"{n}\n" for n in range(40_000))  # ~230 KB: several reads
    (tmp_path / "procs").write_text(text)
    assert kernfs.read(tmp_path / "procs") == text


def test_read_reads_a_proc_file() -> None:
    status = kernfs.read(f"/proc/{os.getpid()}/status")
    assert f"Pid:\t{os.getpid()}\n" in status


def test_read_of_a_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        kernfs.read(tmp_path / "gone")


def test_write_writes_the_value_and_creates_no_file(tmp_path: Path) -> None:
    (tmp_path / "limit").write_text("")
    kernfs.write(tmp_path / "limit", "123")
    assert (tmp_path / "limit").read_text() == "123"
    with pytest.raises(FileNotFoundError):  # never creates a file: a cgroup file that is not there is an error
        kernfs.write(tmp_path / "missing", "1")


def test_subdirectories_lists_directories_only_and_follows_no_link(tmp_path: Path) -> None:
    (tmp_path / "child").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "cgroup.procs").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "child")
    assert sorted(kernfs.subdirectories(tmp_path)) == [str(tmp_path / "child"), str(tmp_path / "other")]
