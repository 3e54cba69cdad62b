"""A conversation's checkpoints' files on disk (workspace/checkpoints.py): saved over, restored,
counted in the conversation's usage, deleted with it or one by one, and a crashed server's copies swept.
The tools' side (variables, tenants, quotas) is in tests/e2e/conversations/test_checkpoints.py."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from mcp_sandbox.config import load_settings
from mcp_sandbox.tenant_uids import TenantUids
from mcp_sandbox.workspace import WorkspaceStore, load_secret
from mcp_sandbox.workspace.checkpoints import Checkpoints, state_key
from settings_helpers import store_of


def _store(state_dir: Path) -> tuple[WorkspaceStore, Checkpoints]:
    settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
    store = store_of(settings, load_secret(state_dir))
    store.prepare()
    return store, Checkpoints(settings.workspaces, store.layout, TenantUids(settings.sandbox, store.layout), store.gate)


def test_a_checkpoint_saved_over_is_replaced_and_a_restore_puts_its_files_back(tmp_path: Path) -> None:
    store, checkpoints = _store(tmp_path)
    key = store.key("t", "c")
    store.write_file(key, "a.txt", b"first", "t")
    checkpoints.save(key, "cp", "t")
    store.write_file(key, "a.txt", b"second", "t")
    checkpoints.save(key, "cp", "t")  # saved over: now "second"
    store.write_file(key, "a.txt", b"third!", "t")
    store.write_file(key, "b.txt", b"later", "t")
    with_checkpoint = store.usage(key).bytes

    checkpoints.restore(key, "cp", "t")

    assert checkpoints.names(key) == ["cp"]
    assert [entry.name for entry in store.list_files(key).files] == ["a.txt"]
    assert (store.directory(key) / "a.txt").read_bytes() == b"second"
    assert with_checkpoint == len(b"third!") + len(b"later") + len(b"second")  # the checkpoint counts
    assert sorted(path.name for path in store.root.iterdir()) == [key]  # nothing left aside


def test_checkpoints_go_with_their_conversation_and_a_crashed_servers_copy_is_swept(tmp_path: Path) -> None:
    store, checkpoints = _store(tmp_path)
    key = store.key("t", "c")
    store.write_file(key, "a.txt", b"data", "t")
    checkpoints.save(key, "cp", "t")
    ended = subprocess.Popen(["true"])
    ended.wait()
    crashed = store.layout.checkpoints / key / f".fork-{ended.pid}-deadbeef"
    (crashed / "sub").mkdir(parents=True)  # a server killed mid-save left it
    live = crashed.with_name(".fork-1-livesvr")  # a live server's save in progress
    live.mkdir()

    store.sweep_partials()
    swept = (crashed.exists(), live.exists())
    store.delete(key)

    assert swept == (False, True)
    assert not checkpoints.path(key, "cp").parent.exists()
    assert checkpoints.names(key) == []


def test_one_checkpoint_is_deleted_under_the_change_lock_its_bytes_given_back(tmp_path: Path) -> None:
    store, checkpoints = _store(tmp_path)
    key = store.key("t", "c")
    store.write_file(key, "a.txt", b"data", "t")
    checkpoints.save(key, "cp", "t")
    checkpoints.save(key, "other", "t")
    state = store.layout.parked_state(state_key(key, "cp"))
    store.layout.prepare_parked()
    state.write_bytes(b"s" * 100)  # its variables, as a parked state
    before = store.usage(key).bytes
    freed: list[int | None] = []
    deleting = threading.Thread(target=lambda: freed.append(checkpoints.delete(key, "cp")))

    with store.gate.changing(key):  # a fork or restore of it copying: the deletion waits
        deleting.start()
        deleting.join(0.2)
        waited = deleting.is_alive() and checkpoints.path(key, "cp").is_dir()
    deleting.join()

    assert waited
    assert freed == [4 + 100]
    assert store.usage(key).bytes == before - 104
    assert checkpoints.names(key) == ["other"] and not state.exists()
    assert checkpoints.delete(key, "cp") is None  # none left: the caller says so
    assert sorted(path.name for path in checkpoints.path(key, "cp").parent.iterdir()) == ["other"]
