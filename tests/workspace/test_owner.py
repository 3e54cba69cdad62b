"""A workspace of the sandbox uid (made before tenants had uids of their own) handed to its tenant's
uid on its first use: what the previous owner had changes, never through a symlink, never what
another uid owns; files the host then writes there are the tenant's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.workspace import load_secret
from mcp_sandbox.workspace.owner import MAX_DEPTH, hand_over
from settings_helpers import store_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root hands a workspace to another uid")

OLD, NEW, OTHER = 1879113000, 1879113001, 1879113002
GID = 1879113100


def _tree(top: Path, outside: Path) -> None:
    """A workspace as code inside could leave it: nested files, a closed directory, symlinks out, a hard link."""
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "deep.txt").write_text("deep")
    (top / "closed").mkdir()
    (top / "closed" / "in.txt").write_text("in")
    (top / "link-out").symlink_to(outside)
    (top / "dir-link-out").symlink_to(outside.parent)
    os.link(outside, top / "hard-link-in")  # someone else's file, linked in
    for path in [top, *top.rglob("*")]:
        if path.name != "hard-link-in":
            os.lchown(path, OLD, OLD)
    os.chmod(top / "closed", 0)


def test_hand_over_changes_what_the_old_owner_had_and_nothing_it_points_at(tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "secret.txt"
    outside.parent.mkdir()
    outside.write_text("not the tenant's")
    os.chown(outside, OTHER, OTHER)
    os.chown(outside.parent, OTHER, OTHER)
    top = tmp_path / "workspace"
    top.mkdir()
    _tree(top, outside)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert hand_over(fd, NEW, GID)
    finally:
        os.close(fd)
    for path in [top, *top.rglob("*")]:
        info = path.lstat()
        expected = OTHER if path.name == "hard-link-in" else NEW
        assert info.st_uid == expected, path
    assert (top / "link-out").lstat().st_gid == GID  # the link itself, lchown'd
    assert outside.stat().st_uid == OTHER and outside.parent.stat().st_uid == OTHER


def test_hand_over_stops_at_its_depth_and_says_so(tmp_path: Path) -> None:
    top = tmp_path / "workspace"
    path = top
    for _ in range(MAX_DEPTH + 2):
        path = path / "d"
    path.mkdir(parents=True)
    for each in [top, *top.rglob("*")]:
        os.lchown(each, OLD, OLD)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert not hand_over(fd, NEW, GID)
    finally:
        os.close(fd)
    assert top.stat().st_uid == NEW
    assert path.stat().st_uid == OLD


def test_an_existing_workspace_is_handed_to_its_tenant_on_first_use(tmp_path: Path) -> None:
    settings = load_settings(env={}, flags={"state_dir": str(tmp_path / "state")})
    store = store_of(settings, load_secret(settings.paths.state_dir))
    key = store.key("alice", "conversation")
    store.ensure(key)  # as before tenants had uids: the sandbox uid's
    workspace = store.directory(key)
    assert workspace.stat().st_uid == settings.sandbox.sandbox_uid
    (workspace / "old.txt").write_text("old")
    os.chown(workspace / "old.txt", settings.sandbox.sandbox_uid, settings.sandbox.sandbox_gid)

    store.ensure(key, "alice")
    alice = json.loads((tmp_path / "state" / "tenant-uids.json").read_text())["alice"]
    assert alice != settings.sandbox.sandbox_uid
    assert workspace.stat().st_uid == alice and (workspace / "old.txt").stat().st_uid == alice
    store.write_file(key, "sub/new.txt", b"new")  # the host's writes: the workspace's owner's
    assert (workspace / "sub").stat().st_uid == alice and (workspace / "sub" / "new.txt").stat().st_uid == alice
    store.ensure(key)  # no tenant named: it keeps its owner
    assert workspace.stat().st_uid == alice
