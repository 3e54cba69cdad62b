"""The reflink volume (``workspaces.volume_bytes``): a fork shares its blocks; each side writes its own.

One volume (a sparse XFS image on a loop device) serves the module; its free blocks, read by
``statvfs`` after a ``syncfs``, are what a fork wrote to disk. The tenant's files are made as
its sandbox would make them (its host uid's). Needs root and xfsprogs; ``make test``
(``MCP_SANDBOX_TEST_REQUIRE`` naming xfs) fails where they are missing.
"""

from __future__ import annotations

import ctypes
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.doctor import _report_forks
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.volume import IMAGE_FILE, VOLUME_DIR, can_reflink, release_volume
from mcp_sandbox.workspace import WorkspaceStore, load_secret
from settings_helpers import store_of

GIB = 1 << 30
OWN_CHANGES_BOUND = 8 << 20  # what a fork of 1 GiB may write: metadata and its own few blocks, far from a copy
WRITTEN = 64 << 20  # of the 1 GiB, the bytes written (the rest allocated): a copy would write them all
MIB = 1 << 20
LARGE_FILES = ("a.bin", "b.bin", "deep/c.bin")  # the large workspace's, LARGE_FILE_BYTES of written data each
LARGE_FILE_BYTES = 64 << 20
HINT = "the reflink volume needs root and mkfs.xfs (Debian: apt-get install xfsprogs)"


def require_volume() -> None:
    """Root and mkfs.xfs; where missing, fail under ``make test`` (it names xfs), else skip."""
    if os.geteuid() == 0 and shutil.which("mkfs.xfs") is not None:
        return
    if "xfs" in os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(","):
        pytest.fail(HINT, pytrace=False)
    pytest.skip(HINT)


def volume_settings(state_dir: Path, **flags: object) -> Settings:
    return load_settings(env={}, flags={"state_dir": str(state_dir), "volume_bytes": 4 * GIB, **flags})


@pytest.fixture(scope="module")
def store(module_state_dir: Path) -> Iterator[WorkspaceStore]:
    require_volume()
    store = store_of(volume_settings(module_state_dir), load_secret(module_state_dir))
    try:
        store.prepare()
        yield store
    finally:
        release_volume(module_state_dir)


def used(store: WorkspaceStore) -> int:
    """The volume's used bytes, once what is written is on it and XFS has let go of its speculative
    preallocation (blocks it reserves past the end of a file that grows: up to the file's size
    again, not data, freed by itself minutes later or when space runs short)."""
    subprocess.run(["xfs_spaceman", "-c", "prealloc -s", str(store.root.parent)], check=True, timeout=60)
    descriptor = os.open(store.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(descriptor) != 0:
            raise OSError(ctypes.get_errno(), "syncfs")
        info = os.fstatvfs(descriptor)
    finally:
        os.close(descriptor)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


def tenant_file(directory: Path, name: str, data: bytes = b"", size: int = 0) -> Path:
    """A file as the tenant's sandbox makes it: its uid's, ``data`` then ``size`` bytes allocated."""
    owner = directory.stat()
    path = directory / name
    for parent in reversed(path.relative_to(directory).parents[:-1]):
        (directory / parent).mkdir(exist_ok=True)
        os.chown(directory / parent, owner.st_uid, owner.st_gid)
    path.write_bytes(data)
    if size:
        with path.open("r+b") as file:
            os.posix_fallocate(file.fileno(), 0, size)
    os.chown(path, owner.st_uid, owner.st_gid)
    return path


BASE = os.urandom(MIB)


def block(index: int) -> bytes:
    """The large workspace's ``index``-th MiB of a file: numbered, so a block read back tells where it came from."""
    return index.to_bytes(8, "big") + BASE[8:]


@pytest.fixture(scope="module")
def large_source(store: WorkspaceStore) -> str:
    """A conversation holding three files of written data (no hole, nothing merely allocated), made once."""
    key = store.key("alice", "large")
    directory = store.ensure(key, "alice")
    for name in LARGE_FILES:
        path = tenant_file(directory, name)
        with path.open("ab") as file:
            for index in range(LARGE_FILE_BYTES // MIB):
                file.write(block(index))
    return key


def read_block(path: Path, index: int) -> bytes:
    with path.open("rb") as file:
        file.seek(index * MIB)
        return file.read(MIB)


def write_block(path: Path, index: int, data: bytes) -> None:
    with path.open("r+b") as file:
        file.seek(index * MIB)
        file.write(data)


def test_the_workspaces_runs_and_uploads_live_on_the_volume_closed_to_other_users(store: WorkspaceStore) -> None:
    root = store.layout.root
    layout = store.layout
    assert os.path.ismount(root / VOLUME_DIR)
    layout.prepare_runs()
    for directory in (layout.workspaces, layout.runs, layout.uploads):
        assert directory.parent == root / VOLUME_DIR
        assert directory.stat().st_dev == (root / VOLUME_DIR).stat().st_dev
    assert (root / VOLUME_DIR).stat().st_mode & 0o7777 in (0o710, 0o711)  # traversable, never listable
    assert (root / IMAGE_FILE).stat().st_mode & 0o777 == 0o600
    with open("/proc/self/mounts", encoding="utf-8") as table:
        (options,) = [line.split()[3] for line in table if line.split()[1] == str(root / VOLUME_DIR)]
    assert {"nodev", "nosuid"} <= set(options.split(","))  # no device or set-id file made inside counts


def test_a_fork_of_a_1_gib_workspace_writes_only_its_own_changes(store: WorkspaceStore) -> None:
    source, fork = store.key("alice", "big"), store.key("alice", "big-fork")
    big = tenant_file(store.ensure(source, "alice"), "data.bin", os.urandom(1 << 20) * (WRITTEN >> 20), GIB)
    before = used(store)

    counts = store.fork(source, fork, "alice")

    assert used(store) - before < OWN_CHANGES_BOUND
    assert (counts.files, counts.bytes, counts.reflinked) == (1, GIB, 1)
    with (store.directory(fork) / "data.bin").open("r+b") as file:
        file.write(b"the fork's own block")
    assert used(store) - before < OWN_CHANGES_BOUND
    with big.open("rb") as file:
        assert file.read(20) != b"the fork's own block"  # the source's block is not the fork's
    assert store.usage(fork).bytes == GIB  # the quota counts what the fork may grow to, as a copy's


def test_a_fork_of_a_large_workspace_of_written_data_writes_only_its_own_changes(
    store: WorkspaceStore, large_source: str
) -> None:
    fork = store.key("alice", "large-fork")
    before = used(store)

    counts = store.fork(large_source, fork, "alice")
    cloned = used(store) - before
    forked = store.directory(fork) / "a.bin"
    write_block(forked, 10, b"F" * MIB)  # in place, in blocks it shared with the source
    with forked.open("ab") as file:
        file.write(b"G" * MIB)
    written = used(store) - before

    assert (counts.files, counts.bytes, counts.reflinked) == (3, 3 * LARGE_FILE_BYTES, 3)
    assert cloned < OWN_CHANGES_BOUND  # a copy would have written 192 MiB
    assert 2 * MIB <= written < OWN_CHANGES_BOUND + 2 * MIB  # its own two MiB, in blocks of its own
    assert read_block(store.directory(large_source) / "a.bin", 10) == block(10)
    assert read_block(forked, 10) == b"F" * MIB


def test_writes_after_a_fork_of_a_large_workspace_stay_on_their_side_and_each_quota_counts_its_own(
    store: WorkspaceStore, large_source: str
) -> None:
    fork = store.key("alice", "large-fork-2")
    store.fork(large_source, fork, "alice")
    source, forked = store.directory(large_source), store.directory(fork)

    write_block(source / "b.bin", 20, b"S" * MIB)
    write_block(forked / "b.bin", 30, b"F" * MIB)
    (forked / "deep" / "c.bin").unlink()
    with (forked / "a.bin").open("ab") as file:
        file.write(b"G" * MIB)

    assert (read_block(source / "b.bin", 20), read_block(source / "b.bin", 30)) == (b"S" * MIB, block(30))
    assert (read_block(forked / "b.bin", 20), read_block(forked / "b.bin", 30)) == (block(20), b"F" * MIB)
    assert read_block(source / "deep" / "c.bin", LARGE_FILE_BYTES // MIB - 1) == block(LARGE_FILE_BYTES // MIB - 1)
    assert store.usage(large_source).bytes == 3 * LARGE_FILE_BYTES
    assert store.usage(fork).bytes == 2 * LARGE_FILE_BYTES + MIB


def test_writes_after_a_fork_stay_on_their_side_and_a_deleted_source_breaks_no_fork(store: WorkspaceStore) -> None:
    source, fork = store.key("alice", "source"), store.key("alice", "source-fork")
    directory = store.ensure(source, "alice")
    tenant_file(directory, "shared.txt", b"before the fork")
    tenant_file(directory, "sub/gone.txt", b"deleted by the source after")
    store.fork(source, fork, "alice")
    forked = store.directory(fork)

    with (directory / "shared.txt").open("r+b") as file:  # in place: the blocks both shared
        file.write(b"SOURCE")
    with (forked / "shared.txt").open("r+b") as file:
        file.write(b"FORK")
    (directory / "sub" / "gone.txt").unlink()
    tenant_file(forked, "fork-only.txt", b"mine")

    assert (directory / "shared.txt").read_bytes() == b"SOURCE the fork"
    assert (forked / "shared.txt").read_bytes() == b"FORKre the fork"
    assert (forked / "sub" / "gone.txt").read_bytes() == b"deleted by the source after"
    assert not (directory / "fork-only.txt").exists()
    store.delete(source)
    assert [entry.name for entry in store.list_files(fork)] == ["fork-only.txt", "shared.txt", "sub/gone.txt"]
    assert (forked / "sub" / "gone.txt").read_bytes() == b"deleted by the source after"


def test_the_volume_is_mounted_again_after_a_restart_with_its_files(store: WorkspaceStore) -> None:
    key = store.key("alice", "kept")
    tenant_file(store.ensure(key, "alice"), "kept.txt", b"across a restart")
    release_volume(store.layout.root)
    assert not (store.directory(key) / "kept.txt").exists()

    again = store_of(volume_settings(store.layout.root), load_secret(store.layout.root))
    again.prepare()

    assert (again.directory(key) / "kept.txt").read_bytes() == b"across a restart"


def test_a_larger_volume_bytes_grows_the_volume_at_the_next_mount_with_its_files(store: WorkspaceStore) -> None:
    root = store.layout.root
    key = store.key("alice", "grown")
    tenant_file(store.ensure(key, "alice"), "kept.txt", b"before it grew")
    before = os.statvfs(store.root)
    release_volume(root)

    grown = store_of(volume_settings(root, volume_bytes=6 * GIB), load_secret(root))
    grown.prepare()

    after = os.statvfs(grown.root)
    assert after.f_blocks * after.f_frsize > before.f_blocks * before.f_frsize + GIB
    assert (root / IMAGE_FILE).stat().st_size == 6 * GIB
    assert (grown.directory(key) / "kept.txt").read_bytes() == b"before it grew"


def test_two_processes_starting_together_mount_the_volume_once(state_dir: Path) -> None:
    require_volume()
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    script = (
        "import sys; from pathlib import Path; from mcp_sandbox.volume import ensure_volume; "
        "ensure_volume(Path(sys.argv[1]), 1 << 30)"
    )
    try:
        starts = [subprocess.Popen([sys.executable, "-c", script, str(state_dir)]) for _ in range(2)]
        assert [start.wait(timeout=60) for start in starts] == [0, 0]
        with open("/proc/self/mounts", encoding="utf-8") as table:
            mounted = [line for line in table if line.split()[1] == str(state_dir / VOLUME_DIR)]
        assert len(mounted) == 1
    finally:
        release_volume(state_dir)


def test_a_volume_that_would_hide_existing_workspaces_is_refused_naming_them(state_dir: Path) -> None:
    require_volume()
    plain = store_of(load_settings(env={}, flags={"state_dir": str(state_dir)}), load_secret(state_dir))
    plain.write_file(plain.key("alice", "old"), "old.txt", b"made before the volume")

    with pytest.raises(ConfigError, match="workspaces"):
        store_of(volume_settings(state_dir), load_secret(state_dir)).prepare()

    assert not os.path.ismount(state_dir / VOLUME_DIR)
    assert not (state_dir / IMAGE_FILE).exists()
    with plain.open_file(plain.key("alice", "old"), "old.txt") as kept:
        assert b"".join(kept.chunks()) == b"made before the volume"


def test_doctor_says_whether_forks_are_reflinked_or_copied(store: WorkspaceStore, state_dir: Path) -> None:
    plain, on_volume = io.StringIO(), io.StringIO()
    _report_forks(load_settings(env={}, flags={"state_dir": str(state_dir)}), plain)
    _report_forks(volume_settings(store.layout.root), on_volume)

    if can_reflink(state_dir):
        assert plain.getvalue().startswith("forks: reflinked (the state directory's filesystem")
    else:
        assert plain.getvalue().startswith("forks: COPIED, every byte")
        assert "workspaces.volume_bytes" in plain.getvalue()
    assert on_volume.getvalue().startswith("forks: reflinked, on the XFS volume")
    assert can_reflink(store.root)
