"""What the earlier runner's links may serve: an imported file, under its name, unchanged."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from mcp_sandbox.workspace.files import OpenFile
from mcp_sandbox.workspace.runner_names import Hashing, ImportedNames


def _open(path: Path, name: str) -> OpenFile:
    fd = os.open(path, os.O_RDONLY)
    return OpenFile(fd=fd, name=name, size=os.fstat(fd).st_size, mtime=0.0)


def _names(content: bytes) -> ImportedNames:
    return ImportedNames({"data.csv": (len(content), hashlib.sha256(content).hexdigest())})


def test_an_unchanged_imported_file_is_served_and_others_are_not(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_bytes(b"a,b\n1,2\n")
    (tmp_path / "other.txt").write_bytes(b"a,b\n1,2\n")  # the same bytes under a name never imported
    names = _names(b"a,b\n1,2\n")
    with _open(tmp_path / "data.csv", "data.csv") as kept, _open(tmp_path / "other.txt", "other.txt") as other:
        assert names.serves(kept)
        assert names.serves(kept)  # remembered: the second check is the identity's
        assert not names.serves(other)


def test_a_file_changed_in_place_to_the_same_size_and_mtime_is_not_served(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_bytes(b"a,b\n1,2\n")
    names = _names(b"a,b\n1,2\n")
    with _open(path, "data.csv") as opened:
        assert names.serves(opened)
    info = path.stat()
    with open(path, "r+b") as changing:
        changing.write(b"X")
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    with _open(path, "data.csv") as opened:
        assert not names.serves(opened)


def test_the_record_round_trips_and_a_damaged_one_serves_nothing(tmp_path: Path) -> None:
    names = _names(b"x")
    names.save(tmp_path / "d.names")
    loaded = ImportedNames.load(tmp_path / "d.names")
    assert loaded is not None and loaded.files == names.files
    (tmp_path / "bad.names").write_text('{"data.csv": "no"}')
    assert ImportedNames.load(tmp_path / "bad.names") is None
    assert ImportedNames.load(tmp_path / "absent.names") is None
    with pytest.raises(ValueError):
        ImportedNames.from_json(b"[1]")


def test_hashing_passes_the_chunks_through_and_counts_them() -> None:
    hashing = Hashing([b"ab", b"c"])
    assert b"".join(hashing) == b"abc"
    assert (hashing.size, hashing.hexdigest) == (3, hashlib.sha256(b"abc").hexdigest())
