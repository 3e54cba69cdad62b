"""Small files written back in packs, against a real SeaweedFS: restored byte for byte on another
replica, a later version restored, a pack no file uses deleted, and a store written one object
per file (before packs) still restored and written back."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.replicas.mirror import Changes, Mirror
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.replicas.packs import PACK_BYTES, PACKS, SMALL
from mcp_sandbox.workspace import load_secret
from s3_helpers import files, objects, s3_env, store_url
from settings_helpers import store_of

Replica = tuple[Mirror, Path]  # a mirror and its state directory


@pytest.fixture
def url() -> str:
    return store_url()


@pytest.fixture
def replica(
    s3_endpoint: str, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], Replica]]:
    """A replica of its own (state directory, mirror) on the one store, by name."""
    for name, value in s3_env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    opened: list[ObjectStore] = []

    def make(name: str) -> Replica:
        state = tmp_path / name
        store = store_of(load_settings(env={}, flags={"state_dir": str(state)}), load_secret(state))
        store.prepare()
        objects_ = ObjectStore(url)
        opened.append(objects_)
        return Mirror(objects_, store), state

    yield make
    for objects_ in opened:
        objects_.close()


KEY = "a" * 64  # a conversation's key: the same on every replica (they share the signing secret)


def _workspace(state: Path) -> Path:
    return state / "workspaces" / KEY


def _stored(endpoint: str, url: str) -> tuple[dict[str, bytes], list[str]]:
    """The workspace's files as the store holds them, and the names of its raw objects."""
    logical = {name.split("/", 2)[2]: body for name, body in files(endpoint, url).items()}
    return logical, [name.split("/", 2)[2] for name in objects(endpoint, url)]


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in directory.rglob("*") if path.is_file()}


def test_many_small_files_go_in_few_packs_and_restore_byte_exact_on_another_replica(
    replica: Callable[[str], Replica], s3_endpoint: str, url: str
) -> None:
    first, first_state = replica("first")
    directory = _workspace(first_state)
    (directory / "many").mkdir(parents=True)
    contents = {f"many/{number:04}.bin": os.urandom(number * 37 % 20_000) for number in range(1_000)}
    contents |= {"big.bin": os.urandom(SMALL + 1), "empty": b"", "just-under": os.urandom(SMALL - 1)}
    for name, content in contents.items():
        (directory / name).write_bytes(content)
    assert first.write_back(KEY).transferred == len(contents)
    logical, raw = _stored(s3_endpoint, url)
    assert logical == contents
    assert "big.bin" in raw  # a large file stays an object of its own
    assert len(raw) < 10  # the big file, the index and a few packs, not an object per file

    second, second_state = replica("second")
    restored = _workspace(second_state)
    restored.mkdir(parents=True)
    os.chown(restored, 4242, 4242)  # the tenant's host uid
    assert second.restore(KEY, None).transferred == len(contents)
    assert _tree(restored) == contents
    for name in contents:
        info = (restored / name).stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (4242, 4242, 0o600), name
    assert second.write_back(KEY) == Changes()  # the restored files are what the store holds
    assert second.restore(KEY, None) == Changes()
    with second.open_remote(KEY, "many/0999.bin") as opened:  # a download through a replica without it
        assert b"".join(opened.chunks()) == contents["many/0999.bin"]


def test_a_file_changed_later_is_restored_in_its_new_version_and_unused_packs_go(
    replica: Callable[[str], Replica], s3_endpoint: str, url: str
) -> None:
    first, first_state = replica("first")
    directory = _workspace(first_state)
    directory.mkdir(parents=True)
    for name in ("a.txt", "b.txt", "c.txt"):
        (directory / name).write_bytes(name.encode() * 1000)
    first.write_back(KEY)
    (_, raw) = _stored(s3_endpoint, url)
    (old_pack,) = [name for name in raw if name.startswith(PACKS) and not name.endswith(".json")]

    (directory / "b.txt").write_bytes(b"the new version")
    (directory / "c.txt").unlink()
    assert first.write_back(KEY) == Changes(transferred=1, bytes=15, deleted=1)
    logical, raw = _stored(s3_endpoint, url)
    assert logical == {"a.txt": b"a.txt" * 1000, "b.txt": b"the new version"}
    # The first pack held a third of live bytes: a.txt was packed again and the pack deleted.
    assert old_pack not in raw
    assert len([name for name in raw if name.startswith(PACKS)]) == 2  # one pack and the index

    second, second_state = replica("second")
    second.restore(KEY, "alice")
    assert _tree(_workspace(second_state)) == logical
    (_workspace(second_state) / "a.txt").unlink()
    (_workspace(second_state) / "b.txt").unlink()
    assert second.write_back(KEY) == Changes(deleted=2)
    assert objects(s3_endpoint, url) == {}  # no file left: no pack and no index either


def test_a_workspace_stored_one_object_per_file_restores_and_is_written_back_in_packs(
    replica: Callable[[str], Replica], s3_endpoint: str, url: str
) -> None:
    old, old_state = replica("old")
    directory = _workspace(old_state)
    (directory / "d").mkdir(parents=True)
    contents = {"a.txt": b"alpha", "d/b.txt": b"beta", "c.txt": b"gamma"}
    manifest: dict[str, list[object]] = {}
    for name, content in contents.items():  # what the mirror wrote before packs, and its manifest
        (directory / name).write_bytes(content)
        etag = old.objects.put(f"workspaces/{KEY}/{name}", content)
        info = (directory / name).stat()
        manifest[name] = [info.st_size, info.st_mtime_ns, etag]
    (old_state / "mirror").mkdir(mode=0o700)
    (old_state / "mirror" / f"{KEY}.json").write_text(json.dumps(manifest))
    assert old.write_back(KEY) == Changes()  # the old manifest is read: nothing counts as changed

    fresh, fresh_state = replica("fresh")
    assert fresh.restore(KEY, "alice").transferred == 3
    assert _tree(_workspace(fresh_state)) == contents

    (directory / "a.txt").write_bytes(b"ALPHA, packed")
    assert old.write_back(KEY).transferred == 1
    logical, raw = _stored(s3_endpoint, url)
    assert logical == {**contents, "a.txt": b"ALPHA, packed"}
    assert "a.txt" not in raw  # its object of before is deleted once the index names the pack
    assert fresh.restore(KEY, "alice") == Changes(transferred=1, bytes=13)
    assert _tree(_workspace(fresh_state)) == logical


def test_a_pack_no_index_names_is_swept(replica: Callable[[str], Replica], s3_endpoint: str, url: str) -> None:
    first, first_state = replica("first")
    _workspace(first_state).mkdir(parents=True)
    (_workspace(first_state) / "a.txt").write_bytes(b"alpha")
    first.write_back(KEY)
    # A write-back killed between storing its pack and replacing the index leaves this behind.
    first.objects.put(f"workspaces/{KEY}/{PACKS}0123456789abcdef01234567", b"x" * 100)
    second, _ = replica("second")
    second.restore(KEY, "alice")
    assert f"{PACKS}0123456789abcdef01234567" not in _stored(s3_endpoint, url)[1]


def test_a_missing_pack_loses_only_its_files_and_the_owners_next_write_back_rebuilds_the_index(
    replica: Callable[[str], Replica], s3_endpoint: str, url: str
) -> None:
    first, first_state = replica("first")
    directory = _workspace(first_state)
    directory.mkdir(parents=True)
    (directory / "a.txt").write_bytes(b"alpha")
    first.write_back(KEY)
    (old_pack,) = [name for name in _stored(s3_endpoint, url)[1] if name.startswith(PACKS) and "index" not in name]
    (directory / "b.txt").write_bytes(b"beta")
    (directory / "big.bin").write_bytes(b"B" * SMALL)
    first.write_back(KEY)
    first.objects.delete([f"workspaces/{KEY}/{old_pack}"])  # behind the owner's back

    second, second_state = replica("second")
    (_workspace(second_state)).mkdir(parents=True)
    (_workspace(second_state) / "a.txt").write_bytes(b"an older alpha")  # a stale copy: kept, never removed
    changes = second.restore(KEY, "alice")
    assert changes.lost == ("a.txt",)  # named, and every other file restored
    assert _tree(_workspace(second_state)) == {"a.txt": b"an older alpha", "b.txt": b"beta", "big.bin": b"B" * SMALL}

    (directory / "c.txt").write_bytes(b"gamma")  # the owner's next write-back finds the index damaged
    assert first.write_back(KEY).unsaved == ()
    expected = {"a.txt": b"alpha", "b.txt": b"beta", "big.bin": b"B" * SMALL, "c.txt": b"gamma"}
    assert _stored(s3_endpoint, url)[0] == expected
    third, third_state = replica("third")
    assert third.restore(KEY, "alice").lost == ()
    assert _tree(_workspace(third_state)) == expected
    (directory / "d.txt").write_bytes(b"delta")
    assert first.write_back(KEY) == Changes(transferred=1, bytes=5)  # repaired: changes only again
    assert old_pack not in _stored(s3_endpoint, url)[1]


def test_an_index_naming_a_deleted_empty_pack_restores_whole_and_is_rebuilt_on_the_next_write_back(
    replica: Callable[[str], Replica], s3_endpoint: str, url: str
) -> None:
    first, first_state = replica("first")
    directory = _workspace(first_state)
    directory.mkdir(parents=True)
    (directory / "a.txt").write_bytes(b"alpha")
    first.write_back(KEY)
    # What main left after a write-back of only empty files: the index names a pack it and the store lack.
    (directory / "empty").write_bytes(b"")
    first.write_back(KEY)
    raw = json.loads(objects(s3_endpoint, url)[f"workspaces/{KEY}/{PACKS}index.json"])
    (empty_pack,) = {raw["files"]["empty"][0]}
    del raw["packs"][empty_pack]  # main deleted the empty pack and wrote the index naming it
    first.objects.delete([f"workspaces/{KEY}/{empty_pack}"])
    first.objects.put(f"workspaces/{KEY}/{PACKS}index.json", json.dumps(raw).encode())

    second, second_state = replica("second")  # the owner's disk copy gone: a restore gets every file
    assert second.restore(KEY, "alice").lost == ()
    assert _tree(_workspace(second_state)) == {"a.txt": b"alpha", "empty": b""}
    (directory / "b.txt").write_bytes(b"beta")
    first.write_back(KEY)  # the owner's next write-back rebuilds the index
    assert _stored(s3_endpoint, url)[0] == {"a.txt": b"alpha", "empty": b"", "b.txt": b"beta"}


def test_empty_files_alone_in_a_pack_survive_write_back_and_restore(
    replica: Callable[[str], Replica], s3_endpoint: str, url: str
) -> None:
    first, first_state = replica("first")
    directory = _workspace(first_state)
    directory.mkdir(parents=True)
    (directory / "empty").write_bytes(b"")  # what a full disk leaves behind (ENOSPC after open)
    first.write_back(KEY)
    (directory / "later.txt").write_bytes(b"later")
    first.write_back(KEY)  # reads the index the first one wrote
    (directory / "empty2").write_bytes(b"")
    first.write_back(KEY)
    assert _stored(s3_endpoint, url)[0] == {"empty": b"", "later.txt": b"later", "empty2": b""}
    second, second_state = replica("second")
    assert second.restore(KEY, "alice").lost == ()
    assert _tree(_workspace(second_state)) == {"empty": b"", "later.txt": b"later", "empty2": b""}


@pytest.mark.parametrize("length", [946, 1024])
def test_a_large_file_whose_key_would_pass_1024_bytes_is_stored_and_restored_under_its_name(
    replica: Callable[[str], Replica], s3_endpoint: str, url: str, length: int
) -> None:
    first, first_state = replica("first")
    directory = _workspace(first_state)
    parts = ["d" * 200] * 4  # components of at most 255 bytes, as every file system has
    name = "/".join([*parts, "f" * (length - 804 - 4)]) + ".bin"
    assert len(name.encode()) == length
    (directory / "/".join(parts)).mkdir(parents=True)
    (directory / name).write_bytes(b"L" * (SMALL + 1))
    (directory / "small.txt").write_bytes(b"small")
    assert first.write_back(KEY).unsaved == ()
    assert _stored(s3_endpoint, url)[0] == {name: b"L" * (SMALL + 1), "small.txt": b"small"}
    second, second_state = replica("second")
    second.restore(KEY, "alice")
    assert (_workspace(second_state) / name).read_bytes() == b"L" * (SMALL + 1)
    with second.open_remote(KEY, name) as opened:
        assert b"".join(opened.chunks()) == b"L" * (SMALL + 1)


def test_packs_are_cut_near_their_size_and_fetched_once_each(
    replica: Callable[[str], Replica], s3_endpoint: str, url: str
) -> None:
    first, first_state = replica("first")
    directory = _workspace(first_state)
    directory.mkdir(parents=True)
    size = SMALL // 2
    count = 3 * PACK_BYTES // size
    for number in range(count):
        (directory / f"{number:03}.bin").write_bytes(bytes([number]) * size)
    first.write_back(KEY)
    raw = _stored(s3_endpoint, url)[1]
    assert 3 <= len([name for name in raw if name.startswith(PACKS)]) - 1 <= 4

    second, second_state = replica("second")
    gets: list[str] = []
    get = second.objects.get

    def counted(name: str, into: IO[bytes]) -> str:
        gets.append(name)
        return get(name, into)

    second.objects.get = counted  # type: ignore[method-assign]  # counts the GETs a restore sends
    second.restore(KEY, "alice")
    assert len(gets) == len(raw)  # the index and each pack once
    assert len(list(_workspace(second_state).iterdir())) == count
