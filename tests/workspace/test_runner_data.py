"""The earlier runner's data: adopted files recorded by name and hash, an older adoption's record rebuilt."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mcp_sandbox.config.tokens import DEFAULT_TENANT
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.workspace import WorkspaceStore
from mcp_sandbox.workspace.runner_data import RunnerData

SECRET = "the-runners-file-secret"


def _runner(tmp_path: Path, store: WorkspaceStore) -> tuple[RunnerData, str]:
    """The runner's data as a server starting now sees it; the digest of conversation ``session-1``."""
    root = tmp_path / "sandbox-root"
    digest = hashlib.sha256(("session-1" + SECRET).encode()).hexdigest()
    if not root.exists():
        (root / digest).mkdir(parents=True)
        (root / digest / "data.csv").write_bytes(b"a,b\n")
    return RunnerData(root, SECRET, tmp_path / "holding", store), digest


def _read(data: RunnerData, digest: str, name: str) -> bytes:
    with data.open_file(digest, name) as opened:
        return b"".join(opened.chunks())


def test_after_adoption_only_the_adopted_file_unchanged_is_served(tmp_path: Path, store: WorkspaceStore) -> None:
    data, digest = _runner(tmp_path, store)
    data.import_all()
    key = store.key(DEFAULT_TENANT, "session-1")
    store.ensure(key, DEFAULT_TENANT)
    assert data.adopt(DEFAULT_TENANT, "session-1", key) == 1
    store.write_file(key, "later.txt", b"written after")

    assert _read(data, digest, "data.csv") == b"a,b\n"
    with pytest.raises(WorkspaceError):
        data.open_file(digest, "later.txt")
    store.write_file(key, "data.csv", b"x,y\n")  # the same name and size, other bytes
    with pytest.raises(WorkspaceError):
        data.open_file(digest, "data.csv")


def test_an_adoption_by_an_older_version_gets_its_record_from_sandbox_root(
    tmp_path: Path, store: WorkspaceStore
) -> None:
    data, digest = _runner(tmp_path, store)
    data.import_all()
    key = store.key(DEFAULT_TENANT, "session-1")
    store.ensure(key, DEFAULT_TENANT)
    data.adopt(DEFAULT_TENANT, "session-1", key)
    (tmp_path / "holding" / f"{digest}.names").unlink()  # as an older version left it: the key only

    restarted, _ = _runner(tmp_path, store)
    with pytest.raises(WorkspaceError):  # no record yet: the links serve nothing
        restarted.open_file(digest, "data.csv")
    restarted.import_all()  # the next start
    assert _read(restarted, digest, "data.csv") == b"a,b\n"
