"""A fork's copy of a conversation's directory (``WorkspaceStore.fork``) on a real filesystem.

The source is played as sandboxed code leaves a workspace: symlinks out, a FIFO, set-id modes, a
hard link to another uid's file, trees past the bounds; a copy that fails leaves nothing.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.errors import DiskFullError, QuotaExceededError, WorkspaceError
from mcp_sandbox.workspace import WorkspaceStore, load_secret
from settings_helpers import store_of

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other uids, a tmpfs)")
OTHER = 1879114000


def _as_tenant(store: WorkspaceStore, top: Path, tenant: str) -> None:
    """Give what the test wrote in ``top`` the tenant's uid, as the tenant's sandbox would have written it."""
    ids = store._uids.ids(tenant)
    if ids is not None:
        for path in [top, *top.rglob("*")]:
            os.lchown(path, *ids)


def _entries(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


def test_a_fork_copies_files_directories_and_links_as_links_and_leaves_out_fifos(
    store: WorkspaceStore, tmp_path: Path
) -> None:
    source, target = store.key("alice", "s"), store.key("alice", "f")
    top = store.ensure(source, "alice")
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "deep.txt").write_text("deep")
    (top / "empty").mkdir()
    secret = tmp_path / "host-secret"
    secret.write_text("host")
    (top / "out").symlink_to(secret)
    (top / "in").symlink_to("a/b/deep.txt")
    os.mkfifo(top / "pipe")  # never opened: a copy would block on it
    (top / "tool").write_text("#!/bin/sh\n")
    _as_tenant(store, top, "alice")
    os.chmod(top / "tool", 0o6755)  # after the chown, which clears set-id bits

    counts = store.fork(source, target, "alice")

    copy = store.directory(target)
    assert _entries(copy) == ["a", "a/b", "a/b/deep.txt", "empty", "in", "out", "tool"]
    assert (copy / "a" / "b" / "deep.txt").read_text() == "deep"
    assert os.readlink(copy / "out") == str(secret)  # the link itself, never what it points at
    assert os.readlink(copy / "in") == "a/b/deep.txt"
    assert stat.S_IMODE(os.stat(copy / "tool").st_mode) == 0o755  # set-id bits dropped
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o700
    assert (counts.files, counts.bytes) == (2, 4 + 10)
    assert [entry.name for entry in store.root.iterdir() if entry.name.startswith(".fork-")] == []


@root_only
def test_a_fork_is_its_tenants_and_leaves_out_what_another_uid_owns(store: WorkspaceStore, tmp_path: Path) -> None:
    source, target = store.key("alice", "s"), store.key("alice", "f")
    top = store.ensure(source, "alice")
    (top / "mine.txt").write_text("mine")
    _as_tenant(store, top, "alice")
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("not the tenant's")
    os.chown(theirs, OTHER, OTHER)
    os.chmod(theirs, 0o600)
    os.link(theirs, top / "linked-in")  # someone else's file, hard-linked in

    store.fork(source, target, "alice")

    copy = store.directory(target)
    assert _entries(copy) == ["mine.txt"]
    ids = store._uids.ids("alice")
    assert ids is not None
    assert {(os.lstat(path).st_uid, os.lstat(path).st_gid) for path in [copy, *copy.rglob("*")]} == {ids}


def test_a_fork_onto_an_existing_conversation_or_past_the_bounds_leaves_nothing(store: WorkspaceStore) -> None:
    source, existing, deep = store.key("alice", "s"), store.key("alice", "e"), store.key("alice", "d")
    top = store.ensure(source, "alice")
    (top / "kept.txt").write_text("kept")
    (store.ensure(existing, "alice") / "own.txt").write_text("own")
    _as_tenant(store, top, "alice")

    with pytest.raises(WorkspaceError):
        store.fork(source, existing, "alice")
    level = top
    for _ in range(70):  # deeper than a workspace walk goes
        level = level / "d"
        level.mkdir()
    _as_tenant(store, top, "alice")
    with pytest.raises(WorkspaceError, match="deeper"):
        store.fork(source, deep, "alice")

    assert _entries(store.directory(existing)) == ["own.txt"]
    assert not store.directory(deep).exists()
    assert [entry.name for entry in store.root.iterdir() if entry.name.startswith(".fork-")] == []


def test_a_fork_of_a_source_over_the_quota_is_refused_before_any_copy(state_dir: Path) -> None:
    settings = load_settings(env={}, flags={"state_dir": str(state_dir), "quota_bytes": 1000, "quota_files": 5})
    store = store_of(settings, load_secret(state_dir))
    store.prepare()
    big, many = store.key("t", "big"), store.key("t", "many")
    (store.ensure(big, "t") / "big.bin").write_bytes(b"x" * 1001)
    for index in range(6):
        (store.ensure(many, "t") / f"{index}.txt").write_text("x")
    _as_tenant(store, store.directory(big), "t")
    _as_tenant(store, store.directory(many), "t")

    with pytest.raises(QuotaExceededError) as over_bytes:
        store.fork(big, store.key("t", "f1"), "t")
    with pytest.raises(QuotaExceededError) as over_files:
        store.fork(many, store.key("t", "f2"), "t")

    assert (over_bytes.value.limit, over_files.value.limit) == ("bytes", "files")
    assert sorted(entry.name for entry in store.root.iterdir()) == sorted([big, many])


@pytest.fixture
def small_state_dir(state_dir: Path) -> Iterator[Path]:
    """``state_dir`` as a 4 MiB tmpfs of its own."""
    state_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(state_dir)], check=True)
    try:
        yield state_dir
    finally:
        subprocess.run(["umount", "-l", str(state_dir)], check=True)


@root_only
def test_a_fork_that_fills_the_disk_leaves_nothing_and_a_crashed_ones_copy_is_swept(small_state_dir: Path) -> None:
    settings = load_settings(env={}, flags={"state_dir": str(small_state_dir)})
    store = store_of(settings, load_secret(small_state_dir))
    store.prepare()
    source = store.key("t", "s")
    (store.ensure(source, "t") / "big.bin").write_bytes(b"x" * (3 << 20))
    _as_tenant(store, store.directory(source), "t")
    before = sorted(entry.name for entry in store.root.iterdir())

    with pytest.raises(DiskFullError):
        store.fork(source, store.key("t", "f"), "t")
    after = sorted(entry.name for entry in store.root.iterdir())
    ended = subprocess.Popen(["true"])
    ended.wait()
    (store.root / f".fork-{ended.pid}-deadbeef" / "sub").mkdir(parents=True)  # a server killed mid-copy left it
    (store.root / ".fork-1-livesvr").mkdir()  # a live server's copy in progress (a shared state directory)
    store.sweep_partials()

    assert after == before
    assert sorted(entry.name for entry in store.root.iterdir()) == sorted([*before, ".fork-1-livesvr"])
