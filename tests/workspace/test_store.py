"""Storing, listing, serving and deleting a conversation's files, with quotas and atomic replacement."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.errors import QuotaExceededError, ValidationError, WorkspaceError
from mcp_sandbox.workspace import RESERVED_PREFIX, WorkspaceStore, load_secret
from mcp_sandbox.workspace.files import Usage
from mcp_sandbox.workspace.reservations import QuotaBook
from settings_helpers import store_of

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="ownership is only handed to the sandbox uid by root")


def _small_store(settings: Settings, **quotas: object) -> WorkspaceStore:
    small = load_settings(env={}, flags={"state_dir": str(settings.paths.state_dir), **quotas})
    return store_of(small, load_secret(small.paths.state_dir))


def _temporaries(directory: Path) -> list[str]:
    """Partial files of the workspace ``directory``: in it (older versions) or in ``uploads/``."""
    uploads = directory.parent.parent / "uploads"
    staged = [path.name for path in uploads.iterdir()] if uploads.is_dir() else []
    return staged + [path.name for path in directory.rglob("*") if path.name.startswith(RESERVED_PREFIX)]


def test_a_write_in_progress_is_outside_the_workspace_and_its_quota(store: WorkspaceStore, key: str) -> None:
    store.write_file(key, "kept.txt", b"k" * 10)
    with store.begin_write(key, "sub/new.bin") as pending:
        pending.write(b"n" * 5000)
        assert sorted(path.name for path in store.directory(key).rglob("*") if path.is_file()) == ["kept.txt"]
        assert store.usage(key) == Usage(bytes=10, files=1)
        assert len(_temporaries(store.directory(key))) == 1
        pending.commit()
    assert store.usage(key) == Usage(bytes=5010, files=2)
    assert _temporaries(store.directory(key)) == []


def test_the_start_sweep_deletes_dead_servers_partials_and_older_versions_but_not_a_live_ones(
    store: WorkspaceStore, key: str, workspace: Path
) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    uploads = store.root.parent / "uploads"
    (uploads / f"{finished.pid}-dead").write_bytes(b"d")
    (uploads / f"{os.getpid()}-live").write_bytes(b"l")
    (workspace / "deep" / "er").mkdir(parents=True)
    for partial in (workspace / f"{RESERVED_PREFIX}upload-a", workspace / "deep" / "er" / f"{RESERVED_PREFIX}upload-b"):
        partial.write_bytes(b"o" * 100)
    (workspace / "deep" / "mine.txt").write_bytes(b"m")

    assert store.sweep_partials() == 3

    assert [path.name for path in uploads.iterdir()] == [f"{os.getpid()}-live"]
    assert sorted(str(path.relative_to(workspace)) for path in workspace.rglob("*") if path.is_file()) == [
        "deep/mine.txt"
    ]


def test_a_key_is_64_hex_digits_and_stable(store: WorkspaceStore) -> None:
    key = store.key("alice", "chat-1")

    assert len(key) == 64
    assert int(key, 16) >= 0
    assert store.key("alice", "chat-1") == key


def test_tenants_never_share_a_key_for_the_same_conversation_id(store: WorkspaceStore) -> None:
    assert store.key("alice", "chat-1") != store.key("bob", "chat-1")
    assert store.key("alice", "chat-1") != store.key("alice", "chat-2")


def test_moving_characters_between_tenant_and_id_changes_the_key(store: WorkspaceStore) -> None:
    assert store.key("ab", "c") != store.key("a", "bc")
    assert store.key("a\x00", "b") != store.key("a", "\x00b")


def test_keys_depend_on_the_server_secret(settings: Settings) -> None:
    one = store_of(settings, b"1" * 32)
    other = store_of(settings, b"2" * 32)

    assert one.key("alice", "chat") != other.key("alice", "chat")


def test_a_directory_is_only_made_for_a_well_formed_key(store: WorkspaceStore) -> None:
    with pytest.raises(WorkspaceError):
        store.directory("../../etc")
    with pytest.raises(WorkspaceError):
        store.open_file("../../etc", "passwd")


@as_root
def test_workspaces_are_traversable_only_and_each_belongs_to_the_sandbox_uid(
    store: WorkspaceStore, settings: Settings, key: str
) -> None:
    path = store.ensure(key)

    root = os.lstat(store.root)
    # Closed to every other host user: only the sandbox gid may traverse (issue 21, finding 12).
    assert (stat.S_IMODE(root.st_mode), root.st_uid, root.st_gid) == (0o710, 0, settings.sandbox.sandbox_gid)
    own = os.lstat(path)
    assert stat.S_IMODE(own.st_mode) == 0o700
    assert (own.st_uid, own.st_gid) == (settings.sandbox.sandbox_uid, settings.sandbox.sandbox_gid)


def test_ensure_is_idempotent_and_repairs_a_mode_the_code_changed(store: WorkspaceStore, key: str) -> None:
    path = store.ensure(key)
    path.chmod(0o777)

    assert store.ensure(key) == path
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700


def test_a_written_file_is_listed_served_and_deleted(store: WorkspaceStore, key: str) -> None:
    entry = store.write_file(key, "plots/a.png", b"\x89PNG data")

    assert (entry.name, entry.size) == ("plots/a.png", 9)
    assert [f.name for f in store.list_files(key).files] == ["plots/a.png"]
    with store.open_file(key, "plots/a.png") as opened:
        assert b"".join(opened.chunks()) == b"\x89PNG data"
        assert opened.size == 9
    store.delete_file(key, "plots/a.png")
    assert store.list_files(key).files == ()


@as_root
def test_written_files_and_directories_belong_to_the_sandbox_uid_and_no_one_else(
    store: WorkspaceStore, settings: Settings, key: str
) -> None:
    store.write_file(key, "deep/er/file.txt", b"x")
    path = store.directory(key)

    for made, mode in ((path / "deep", 0o700), (path / "deep" / "er", 0o700), (path / "deep/er/file.txt", 0o600)):
        info = os.lstat(made)
        assert stat.S_IMODE(info.st_mode) == mode
        assert (info.st_uid, info.st_gid) == (settings.sandbox.sandbox_uid, settings.sandbox.sandbox_gid)


def test_a_listing_is_sorted_by_name_with_sizes(store: WorkspaceStore, key: str) -> None:
    for name in ("b.txt", "a/z.txt", "a/b.txt", "c"):
        store.write_file(key, name, name.encode())

    listing = store.list_files(key)

    assert [(f.name, f.size) for f in listing.files] == [("a/b.txt", 7), ("a/z.txt", 7), ("b.txt", 5), ("c", 1)]
    assert not listing.truncated


def test_a_conversation_without_a_directory_lists_nothing_and_uses_nothing(store: WorkspaceStore) -> None:
    key = store.key("alice", "never-used")

    assert store.list_files(key).files == ()
    assert (store.usage(key).bytes, store.usage(key).files) == (0, 0)
    with pytest.raises(WorkspaceError):
        store.open_file(key, "x")


def test_data_can_stream_in_chunks_of_unknown_total(store: WorkspaceStore, key: str) -> None:
    def body() -> Iterator[bytes]:
        for index in range(100):
            yield bytes([index]) * 1000

    entry = store.write_file(key, "stream.bin", body())

    assert entry.size == 100_000
    with store.open_file(key, "stream.bin") as opened:
        data = b"".join(opened.chunks(4096))
    assert data == b"".join(bytes([i]) * 1000 for i in range(100))


def test_an_upload_replaces_the_old_file_only_when_it_commits(store: WorkspaceStore, key: str) -> None:
    store.write_file(key, "data.csv", b"old,content\n")
    held = store.open_file(key, "data.csv")

    with store.begin_write(key, "data.csv") as pending:
        pending.write(b"new,")
        with store.open_file(key, "data.csv") as during:
            assert b"".join(during.chunks()) == b"old,content\n"
        pending.write(b"content\n")
        pending.commit()

    with store.open_file(key, "data.csv") as after:
        assert b"".join(after.chunks()) == b"new,content\n"
    with held:  # a reader that opened before keeps the whole old file
        assert b"".join(held.chunks()) == b"old,content\n"
    assert _temporaries(store.directory(key)) == []


def test_an_abandoned_write_leaves_nothing_behind(store: WorkspaceStore, key: str) -> None:
    store.write_file(key, "keep.txt", b"kept")

    with store.begin_write(key, "keep.txt") as pending:
        pending.write(b"half")

    with store.open_file(key, "keep.txt") as opened:
        assert b"".join(opened.chunks()) == b"kept"
    assert _temporaries(store.directory(key)) == []


def test_going_past_the_byte_quota_mid_stream_changes_nothing_stored(settings: Settings) -> None:
    store = _small_store(settings, quota_bytes=1000)
    key = store.key("alice", "chat")
    store.write_file(key, "a.bin", b"a" * 400)
    store.write_file(key, "b.bin", b"b" * 500)

    with pytest.raises(QuotaExceededError) as caught:
        store.write_file(key, "b.bin", iter([b"c" * 300, b"c" * 300, b"c" * 300]))

    assert (caught.value.limit, caught.value.used, caught.value.quota) == ("bytes", 900, 1000)
    with store.open_file(key, "b.bin") as opened:
        assert b"".join(opened.chunks()) == b"b" * 500
    assert store.usage(key).bytes == 900
    assert _temporaries(store.directory(key)) == []


def test_replacing_a_file_counts_only_the_difference_against_the_quota(settings: Settings) -> None:
    store = _small_store(settings, quota_bytes=1000)
    key = store.key("alice", "chat")
    store.write_file(key, "a.bin", b"a" * 900)

    entry = store.write_file(key, "a.bin", b"b" * 1000)

    assert entry.size == 1000


def test_going_past_the_file_quota_is_refused_before_writing(settings: Settings) -> None:
    store = _small_store(settings, quota_files=2)
    key = store.key("alice", "chat")
    store.write_file(key, "one", b"1")
    store.write_file(key, "two", b"2")

    with pytest.raises(QuotaExceededError) as caught:
        store.write_file(key, "three", b"3")

    assert (caught.value.limit, caught.value.used, caught.value.quota) == ("files", 2, 2)
    with pytest.raises(QuotaExceededError):
        store.write_file(key, "new/dir/three", b"3")
    assert not (store.directory(key) / "new").exists()
    store.write_file(key, "two", b"replacing is fine")
    assert sorted(f.name for f in store.list_files(key).files) == ["one", "two"]


def test_files_the_code_made_count_against_the_quota(settings: Settings) -> None:
    store = _small_store(settings, quota_bytes=100)
    key = store.key("alice", "chat")
    (store.ensure(key) / "made-by-code.bin").write_bytes(b"x" * 90)

    with pytest.raises(QuotaExceededError):
        store.write_file(key, "upload.bin", b"y" * 20)


def test_usage_counts_every_regular_file_by_its_size(store: WorkspaceStore, key: str, workspace: Path) -> None:
    store.write_file(key, "a", b"12345")
    (workspace / "line\nbreak").write_bytes(b"123")  # not listable, still stored
    (workspace / "sub").mkdir()
    (workspace / "sub" / "b").write_bytes(b"1")

    usage = store.usage(key)

    assert (usage.bytes, usage.files, usage.complete) == (9, 3, True)


def test_concurrent_writers_of_one_name_never_tear_the_file(store: WorkspaceStore, key: str) -> None:
    versions = [bytes([65 + i]) * 200_000 for i in range(4)]
    errors: list[BaseException] = []

    def writer(data: bytes) -> None:
        try:
            for _ in range(10):
                store.write_file(key, "shared.bin", iter([data[:100_000], data[100_000:]]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(data,)) for data in versions]
    for thread in threads:
        thread.start()
    seen = set()
    deadline = time.monotonic() + 60
    while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
        try:
            with store.open_file(key, "shared.bin") as opened:
                seen.add(b"".join(opened.chunks()))
        except WorkspaceError:
            pass  # not written yet
    for thread in threads:
        thread.join(timeout=30)

    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert seen <= set(versions)
    with store.open_file(key, "shared.bin") as opened:
        assert b"".join(opened.chunks()) in versions
    assert _temporaries(store.directory(key)) == []


def test_writing_over_a_directory_is_refused(store: WorkspaceStore, key: str) -> None:
    store.write_file(key, "dir/file", b"x")

    with pytest.raises(WorkspaceError):
        store.write_file(key, "dir", b"y")
    with pytest.raises(WorkspaceError):
        store.write_file(key, "dir/file/below", b"y")


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../x", "a\x00b", "a\\b", "x" * 300])
def test_every_operation_refuses_a_name_that_could_escape(store: WorkspaceStore, key: str, name: str) -> None:
    with pytest.raises(ValidationError):
        store.write_file(key, name, b"x")
    with pytest.raises(ValidationError):
        store.open_file(key, name)
    with pytest.raises(ValidationError):
        store.delete_file(key, name)


def test_deleting_a_missing_file_is_an_error(store: WorkspaceStore, key: str, workspace: Path) -> None:
    with pytest.raises(WorkspaceError):
        store.delete_file(key, "missing.txt")


def test_deleting_a_conversation_removes_its_directory(store: WorkspaceStore, key: str) -> None:
    store.write_file(key, "a/b/c.txt", b"x")

    store.delete(key)

    assert not store.directory(key).exists()
    assert store.keys() == []


def test_keys_lists_the_conversation_directories_on_disk(store: WorkspaceStore) -> None:
    made = sorted(store.key("alice", str(i)) for i in range(3))
    for key in made:
        store.ensure(key)
    (store.root / "not-a-key").mkdir()

    assert store.keys() == made


def test_concurrent_writes_into_one_conversation_cannot_pass_its_quota_together(settings: Settings) -> None:
    store = _small_store(settings, quota_bytes=1 << 20)
    key = store.key("alice", "c")
    start = threading.Barrier(16)
    outcomes: list[str] = []

    def write(index: int) -> None:
        def chunks() -> Iterator[bytes]:
            start.wait()
            for _ in range(9):
                yield b"q" * (100 << 10)
                time.sleep(0.001)

        try:
            store.write_file(key, f"part-{index}.bin", chunks())
            outcomes.append("stored")
        except QuotaExceededError:
            outcomes.append("refused")

    threads = [threading.Thread(target=write, args=(index,)) for index in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["refused"] * 15 + ["stored"]
    assert store.usage(key).bytes == 900 << 10
    assert _temporaries(store.directory(key)) == []


def test_the_last_two_writes_contending_for_the_room_are_not_both_refused() -> None:
    """The race the test above lost in CI once: the refused write held its room until it unwound."""
    book = QuotaBook(1 << 20, 100, lambda key: Usage(0, 0))
    first = book.open("k", "first.bin", Usage(0, 0), None)
    second = book.open("k", "second.bin", Usage(0, 0), None)
    first.reserve(500 << 10)
    second.reserve(500 << 10)

    with pytest.raises(QuotaExceededError):
        first.reserve(100 << 10)  # 1100 KiB together: refused ...
    second.reserve(100 << 10)  # ... and its 500 KiB are free again before it is released
    with pytest.raises(QuotaExceededError):
        second.reserve(500 << 10)  # the quota itself still holds
