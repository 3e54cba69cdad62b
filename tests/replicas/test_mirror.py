"""The mirror against a real SeaweedFS: write-back of changes only, restore to the store's copy,
and sandboxed code's symlinks followed by neither."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.errors import LeaseLostError, WorkspaceError
from mcp_sandbox.replicas.mirror import Changes, Mirror
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.workspace import load_secret
from s3_helpers import files, objects, s3_env, store_url
from settings_helpers import store_of


@pytest.fixture
def settings(state_dir: Path) -> Settings:
    return load_settings(env={}, flags={"state_dir": str(state_dir)})


@pytest.fixture
def url() -> str:
    return store_url()


@pytest.fixture
def mirror(settings: Settings, s3_endpoint: str, url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mirror]:
    for name, value in s3_env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    store = store_of(settings, load_secret(settings.paths.state_dir))
    store.prepare()
    objects_ = ObjectStore(url)
    objects_.check()
    yield Mirror(objects_, store)
    objects_.close()


@pytest.fixture
def key(settings: Settings) -> str:
    return store_of(settings, load_secret(settings.paths.state_dir)).key("alice", "conversation-1")


def _workspace(settings: Settings, key: str) -> Path:
    return settings.paths.state_dir / "workspaces" / key


def test_write_back_sends_changes_only_and_restore_makes_the_directory_equal_to_the_store(
    mirror: Mirror, settings: Settings, key: str, url: str, s3_endpoint: str
) -> None:
    directory = _workspace(settings, key)
    directory.mkdir(parents=True)
    (directory / "a.txt").write_text("alpha")
    (directory / "d").mkdir()
    (directory / "d" / "b.txt").write_text("beta")
    assert mirror.write_back(key) == Changes(transferred=2, bytes=9, deleted=0)
    assert mirror.write_back(key) == Changes()  # nothing changed: nothing sent

    (directory / "a.txt").write_text("ALPHA")  # same size, another mtime
    os.utime(directory / "a.txt", ns=(1, 1))
    (directory / "d" / "b.txt").unlink()
    (directory / "extra.txt").write_text("only here")
    restored = mirror.restore(key, "alice")
    assert restored == Changes(transferred=2, bytes=9, deleted=1)
    assert (directory / "a.txt").read_text() == "alpha"
    assert (directory / "d" / "b.txt").read_text() == "beta"
    assert not (directory / "extra.txt").exists()
    # The restored files are the workspace's owner's (the tenant's host uid), as uploads are.
    assert (directory / "a.txt").stat().st_uid == directory.stat().st_uid
    assert mirror.restore(key, "alice") == Changes()  # already equal: nothing downloaded

    (directory / "a.txt").unlink()
    assert mirror.write_back(key) == Changes(deleted=1)
    assert sorted(name.split("/", 2)[2] for name in files(s3_endpoint, url)) == ["d/b.txt"]


def test_write_back_does_not_follow_a_symlink_the_code_made(
    mirror: Mirror, settings: Settings, key: str, url: str, s3_endpoint: str, tmp_path: Path
) -> None:
    outside = tmp_path / "host-secret"
    outside.write_text("host only")
    directory = _workspace(settings, key)
    directory.mkdir(parents=True)
    (directory / "link.txt").symlink_to(outside)
    (directory / "linked-dir").symlink_to(tmp_path)
    mirror.write_back(key)
    assert objects(s3_endpoint, url) == {}


def test_restore_writes_nothing_through_a_symlinked_directory(
    mirror: Mirror, settings: Settings, key: str, tmp_path: Path
) -> None:
    directory = _workspace(settings, key)
    (directory / "d").mkdir(parents=True)
    (directory / "d" / "b.txt").write_text("beta")
    mirror.write_back(key)
    # The code replaces the directory with a link to a host directory, then the workspace is restored.
    (directory / "d" / "b.txt").unlink()
    (directory / "d").rmdir()
    outside = tmp_path / "host-dir"
    outside.mkdir()
    (directory / "d").symlink_to(outside)
    with pytest.raises(WorkspaceError):
        mirror.restore(key, "alice")
    assert list(outside.iterdir()) == []


def test_a_new_conversation_restores_to_nothing_and_makes_no_directory(
    mirror: Mirror, settings: Settings, key: str
) -> None:
    assert mirror.restore(key, "alice") == Changes()
    assert not _workspace(settings, key).exists()


def test_a_restore_brings_back_every_file_byte_for_byte_whatever_its_size(
    mirror: Mirror, settings: Settings, key: str
) -> None:
    directory = _workspace(settings, key)
    directory.mkdir(parents=True)
    contents = {f"f{size}.bin": os.urandom(size) for size in (0, 1, 65_537, 3 << 20)}
    contents |= {f"many/{number:03}.txt": f"file {number}\n".encode() for number in range(200)}
    for name, content in contents.items():
        (directory / name).parent.mkdir(exist_ok=True)
        (directory / name).write_bytes(content)
    mirror.write_back(key)
    manifest = settings.paths.state_dir / "mirror" / f"{key}.json"
    before = manifest.stat().st_mtime_ns
    assert mirror.write_back(key) == Changes()
    assert manifest.stat().st_mtime_ns == before  # nothing changed: not even the manifest rewritten

    for name in contents:
        (directory / name).unlink()
    assert mirror.restore(key, "alice").transferred == len(contents)
    for name, content in contents.items():
        assert (directory / name).read_bytes() == content, name
        assert (directory / name).stat().st_mode & 0o777 == 0o600
    assert mirror.write_back(key) == Changes()  # the restored files are what the store holds


def test_a_missing_object_is_file_not_found_and_the_next_reads_are_whole(mirror: Mirror) -> None:
    store = mirror.objects
    store.put("probe/present.bin", b"p" * 70_000)
    for _ in range(3):  # the same pooled connection serves the refusals and the reads after them
        with pytest.raises(FileNotFoundError):
            store.get("probe/absent.bin", io.BytesIO())
        into = io.BytesIO(b"left from before")
        into.seek(0, io.SEEK_END)
        assert store.get("probe/present.bin", into)
        assert into.getvalue() == b"left from before" + b"p" * 70_000


def test_a_write_back_of_a_replica_that_lost_the_lease_puts_nothing_or_writes_no_manifest(
    mirror: Mirror, settings: Settings, key: str, url: str, s3_endpoint: str
) -> None:
    directory = _workspace(settings, key)
    directory.mkdir(parents=True)
    (directory / "a.txt").write_text("alpha")
    checks: list[str] = []

    def fence(lost_at: int) -> Callable[[], None]:
        def check() -> None:
            checks.append("check")
            if len(checks) >= lost_at:
                raise LeaseLostError("another replica took the lease")

        return check

    with pytest.raises(LeaseLostError):
        mirror.write_back(key, fence(lost_at=1))  # lost before it began
    assert objects(s3_endpoint, url) == {}
    checks.clear()
    with pytest.raises(LeaseLostError):
        mirror.write_back(key, fence(lost_at=2))  # lost while it was putting the objects
    assert not (settings.paths.state_dir / "mirror" / f"{key}.json").exists()
    assert mirror.write_back(key) == Changes(transferred=1, bytes=5)  # no manifest: everything is sent again


def test_seaweedfs_refuses_a_conditional_write_on_a_stale_etag_or_an_existing_name(mirror: Mirror) -> None:
    store = mirror.objects
    assert store.put_if("probe/index.json", b"one", None)  # none there yet
    assert not store.put_if("probe/index.json", b"two", None)  # If-None-Match: * on an existing name
    current = store.get("probe/index.json", io.BytesIO())
    store.put("probe/index.json", b"three")
    assert not store.put_if("probe/index.json", b"four", current)  # If-Match a stale ETag: 412
    assert store.put_if("probe/index.json", b"five", store.get("probe/index.json", io.BytesIO()))
    into = io.BytesIO()
    store.get("probe/index.json", into)
    assert into.getvalue() == b"five"


def test_a_writer_of_an_earlier_epoch_cannot_replace_the_index_a_takeover_sealed(
    mirror: Mirror, settings: Settings, key: str, url: str, s3_endpoint: str
) -> None:
    directory = _workspace(settings, key)
    directory.mkdir(parents=True)
    (directory / "a.txt").write_text("alpha")
    mirror.write_back(key, epoch=1)
    stale = Mirror(mirror.objects, store_of(settings, load_secret(settings.paths.state_dir)))
    mirror.restore(key, "alice", epoch=2)  # taken over in epoch 2: the index says so before anything is swept
    (directory / "a.txt").write_text("alpha, later")

    with pytest.raises(LeaseLostError):
        stale.write_back(key, epoch=1)
    assert files(s3_endpoint, url)[f"workspaces/{key}/a.txt"] == b"alpha"
    mirror.write_back(key, epoch=2)
    assert files(s3_endpoint, url)[f"workspaces/{key}/a.txt"] == b"alpha, later"


def test_a_pack_no_index_names_is_swept_by_a_restore_only_once_older_than_the_grace(
    mirror: Mirror, settings: Settings, key: str, url: str, s3_endpoint: str
) -> None:
    directory = _workspace(settings, key)
    directory.mkdir(parents=True)
    (directory / "a.txt").write_text("alpha")
    mirror.write_back(key, epoch=1)
    orphan = f"workspaces/{key}/.mcp-sandbox-packs/{'0' * 24}"  # a stalled owner's pack, its index not yet written
    mirror.objects.put(orphan, b"packed files")
    patient = Mirror(mirror.objects, store_of(settings, load_secret(settings.paths.state_dir)), grace=3600)

    patient.restore(key, "alice", epoch=2)
    assert orphan in objects(s3_endpoint, url)  # young: kept
    mirror.restore(key, "alice", epoch=3)  # no grace: swept
    assert orphan not in objects(s3_endpoint, url)
