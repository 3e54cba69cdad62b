"""What sandboxed code can put in its workspace never leads the host out of it, nor blocks it.

The tests play the sandboxed code by creating the traps directly in the conversation's
directory, as the code would through ``/workspace``.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.workspace import WorkspaceStore

_PASSWD = Path("/etc/passwd")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the workspace with a file the code would like to reach."""
    target = tmp_path / "outside"
    target.mkdir()
    (target / "f").write_bytes(b"OUTSIDE")
    (target / "passwd").write_bytes(b"OUTSIDE")
    return target


def test_a_symlink_named_like_the_file_is_never_followed(store: WorkspaceStore, key: str, workspace: Path) -> None:
    (workspace / "data.csv").symlink_to(_PASSWD)
    before = _digest(_PASSWD)

    with pytest.raises(WorkspaceError):
        store.open_file(key, "data.csv")
    assert store.list_files(key).files == ()
    assert store.usage(key).files == 0

    store.write_file(key, "data.csv", b"replaced the link")
    assert not (workspace / "data.csv").is_symlink()
    assert _digest(_PASSWD) == before

    (workspace / "link").symlink_to(_PASSWD)
    store.delete_file(key, "link")
    assert not os.path.lexists(workspace / "link")
    assert _digest(_PASSWD) == before


def test_a_symlinked_directory_component_is_never_followed(
    store: WorkspaceStore, key: str, workspace: Path, outside: Path
) -> None:
    (workspace / "d").symlink_to(outside)
    (workspace / "etc").symlink_to("/etc")

    for name in ("d/f", "etc/passwd"):
        with pytest.raises(WorkspaceError):
            store.open_file(key, name)
        with pytest.raises(WorkspaceError):
            store.delete_file(key, name)
    with pytest.raises(WorkspaceError):
        store.write_file(key, "d/new", b"x")
    with pytest.raises(WorkspaceError):
        store.write_file(key, "d/sub/new", b"x")

    assert store.list_files(key).files == ()
    assert sorted(os.listdir(outside)) == ["f", "passwd"]
    assert (outside / "f").read_bytes() == b"OUTSIDE"


def _open_fifo_writer(path: Path) -> None:
    """Release a reader blocked on ``path`` (if the code under test ever blocks)."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.anyio
async def test_a_fifo_named_like_the_file_is_refused_without_blocking(
    store: WorkspaceStore, key: str, workspace: Path
) -> None:
    fifo = workspace / "data.csv"
    os.mkfifo(fifo)
    try:
        with anyio.fail_after(5):
            with pytest.raises(WorkspaceError):
                await anyio.to_thread.run_sync(store.open_file, key, "data.csv", abandon_on_cancel=True)
            listing = await anyio.to_thread.run_sync(store.list_files, key, abandon_on_cancel=True)
    finally:
        _open_fifo_writer(fifo)

    assert listing.files == ()
    entry = store.write_file(key, "data.csv", b"a regular file now")
    assert entry.size == 18


def test_device_nodes_are_neither_listed_nor_opened(store: WorkspaceStore, key: str, workspace: Path) -> None:
    try:
        os.mknod(workspace / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.mknod(workspace / "disk", stat.S_IFBLK | 0o600, os.makedev(7, 0))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")

    for name in ("null", "disk"):
        with pytest.raises(WorkspaceError):
            store.open_file(key, name)
    assert store.list_files(key).files == ()
    assert store.usage(key).files == 0


def test_sockets_are_neither_listed_nor_opened(store: WorkspaceStore, key: str, workspace: Path) -> None:
    # A socket path must be short (108 bytes): bind in a short directory, then move it in.
    with tempfile.TemporaryDirectory() as short, socket.socket(socket.AF_UNIX) as listener:
        listener.bind(f"{short}/s")
        os.rename(f"{short}/s", workspace / "results.json")

        with pytest.raises(WorkspaceError):
            store.open_file(key, "results.json")
        assert store.list_files(key).files == ()


def test_a_directory_in_place_of_a_file_is_not_served(store: WorkspaceStore, key: str, workspace: Path) -> None:
    (workspace / "data.csv").mkdir()

    with pytest.raises(WorkspaceError):
        store.open_file(key, "data.csv")


def test_names_that_cannot_be_served_are_left_out_and_every_listed_name_opens(
    store: WorkspaceStore, key: str, workspace: Path
) -> None:
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for raw in (b"line\nbreak.txt", b"\xff\xfe-not-utf8", b".mcp-sandbox-upload-fake", b"back\\slash", b"ok.txt"):
            os.close(os.open(raw, os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    (workspace / "d" / "\x1b[31m").mkdir(parents=True)
    (workspace / "d" / "\x1b[31m" / "hidden.txt").write_bytes(b"x")
    deep = workspace.joinpath(*["n"] * 16)
    deep.mkdir(parents=True)
    (deep / "too-deep.txt").write_bytes(b"x")  # 17 components
    (deep.parent / "deep-enough.txt").write_bytes(b"x")  # 16 components

    names = [entry.name for entry in store.list_files(key).files]

    assert names == ["/".join(["n"] * 15 + ["deep-enough.txt"]), "ok.txt"]
    for name in names:
        with store.open_file(key, name) as opened:
            assert opened.size == 0 or opened.size == 1
    assert store.usage(key).files == 8


def test_a_directory_the_code_closed_is_skipped_and_left_closed(
    store: WorkspaceStore, key: str, workspace: Path
) -> None:
    locked = workspace / "locked"
    locked.mkdir()
    (locked / "secret.txt").write_bytes(b"x")
    locked.chmod(0)
    (workspace / "open.txt").write_bytes(b"y")

    listing = store.list_files(key)

    assert [entry.name for entry in listing.files] == ["open.txt"]
    assert stat.S_IMODE(os.lstat(locked).st_mode) == 0


def _deep_tree(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


def test_a_tree_deeper_than_path_max_is_walked_within_bounds_and_deleted(
    store: WorkspaceStore, key: str, workspace: Path
) -> None:
    _deep_tree(workspace, 3000)
    (workspace / "top.txt").write_bytes(b"z")

    listing = store.list_files(key)
    usage = store.usage(key)

    assert [entry.name for entry in listing.files] == ["top.txt"]
    assert (usage.files, usage.complete) == (1, False)  # the leaf is past the depth bound
    store.delete(key)
    assert not workspace.exists()


def test_a_listing_past_its_entry_bound_stops_and_says_so(store: WorkspaceStore, key: str, workspace: Path) -> None:
    for index in range(50):
        (workspace / f"f{index:02}").write_bytes(b"x")

    listing = store.list_files(key, max_entries=10)

    assert listing.truncated
    assert len(listing.files) == 10


def test_a_directory_swapped_for_a_symlink_between_two_opens_is_refused(
    store: WorkspaceStore, key: str, workspace: Path, outside: Path
) -> None:
    (workspace / "d").mkdir()
    (workspace / "d" / "f").write_bytes(b"INSIDE")
    with store.open_file(key, "d/f") as first:
        assert b"".join(first.chunks()) == b"INSIDE"

    os.rename(workspace / "d", workspace / "moved")
    (workspace / "d").symlink_to(outside)

    with pytest.raises(WorkspaceError):
        store.open_file(key, "d/f")


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(libc: ctypes.CDLL, one: Path, other: Path) -> None:
    """Atomically swap two names (renameat2 RENAME_EXCHANGE): each always exists."""
    if libc.renameat2(_AT_FDCWD, os.fsencode(one), _AT_FDCWD, os.fsencode(other), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


@contextlib.contextmanager
def _flipping(workspace: Path, outside: Path) -> Iterator[list[int]]:
    """In a thread, swap ``d`` (a real directory) and a symlink to ``outside``, over and over."""
    libc = ctypes.CDLL(None, use_errno=True)
    (workspace / "swap").symlink_to(outside)
    stop = threading.Event()
    flips = [0]
    failures: list[BaseException] = []

    def flip() -> None:
        try:
            while not stop.is_set() and flips[0] < 1_000_000:
                _exchange(libc, workspace / "d", workspace / "swap")
                flips[0] += 1
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=flip)
    thread.start()
    try:
        yield flips
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert failures == []


def test_a_directory_swapped_for_a_symlink_while_opening_never_leads_out(
    store: WorkspaceStore, key: str, workspace: Path, outside: Path
) -> None:
    (workspace / "d").mkdir()
    (workspace / "d" / "f").write_bytes(b"INSIDE")
    seen: set[bytes] = set()

    with _flipping(workspace, outside) as flips:
        for _ in range(3000):
            try:
                with store.open_file(key, "d/f") as opened:
                    seen.add(b"".join(opened.chunks()))
            except WorkspaceError:
                pass  # the symlink was in place: refused, as it should be
            names = {entry.name for entry in store.list_files(key).files}
            assert names <= {"d/f", "swap/f"}

    assert flips[0] > 0
    assert seen <= {b"INSIDE"}


def test_a_directory_swapped_for_a_symlink_while_writing_never_writes_outside(
    store: WorkspaceStore, key: str, workspace: Path, outside: Path
) -> None:
    (workspace / "d").mkdir()
    before = {path.name: path.read_bytes() for path in outside.iterdir()}

    with _flipping(workspace, outside):
        for index in range(1000):
            with contextlib.suppress(WorkspaceError):
                store.write_file(key, f"d/new-{index}", b"uploaded")

    assert {path.name: path.read_bytes() for path in outside.iterdir()} == before
