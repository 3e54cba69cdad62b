"""Checkpoints with an object store (``object_store_url``), against a real SeaweedFS: a checkpoint
saved by one server is restored, files and variables, by another that never held it (its own state
directory, the same bucket and secret, as a replica taking the conversation over), and retention
deletes a conversation's checkpoints from the store with it.

Both services run in this process, one after the other, each with its MCP client in memory.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from mcp import Client

from mcp_sandbox import load_settings
from mcp_sandbox.server import build_server
from mcp_sandbox.server.service import Service, open_service
from mcp_sandbox.workspace import sweep
from mcp_sandbox.workspace.checkpoints import state_key
from mcp_test_helpers import new_conversation, run_python, structured
from s3_helpers import objects, s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@asynccontextmanager
async def _serving(state_dir: Path, url: str, runtime: Path | None) -> AsyncIterator[tuple[Service, Client]]:
    flags: dict[str, Any] = {"state_dir": str(state_dir), "discover_servers": False, "object_store_url": url}
    if runtime is not None:
        flags["python_runtime"] = str(runtime)
    async with open_service(load_settings(env={}, flags=flags), http=False) as service:
        async with Client(build_server(service)) as client:
            yield service, client


def _sharing_the_secret(first: Path, second: Path) -> Path:
    """``second``, a new server's state directory with ``first``'s secret (as replicas share one)."""
    second.mkdir(mode=0o700)
    (second / "secret").write_bytes((first / "secret").read_bytes())
    (second / "secret").chmod(0o600)
    return second


async def _run(client: Client, code: str, conversation: str, **arguments: Any) -> dict[str, Any]:
    return structured(await run_python(client, {"code": code, "conversationId": conversation, **arguments}))


async def test_a_checkpoint_saved_by_one_server_is_restored_by_another_from_the_store_and_deleted_with_it(
    state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    url, conversation = store_url(), new_conversation()
    first = state_dir / "first"
    async with _serving(first, url, sandbox_runtime) as (_, client):
        made = await _run(client, "value = 'saved'\nopen('f.txt', 'w').write('saved')", conversation)
        saved = await _run(client, "value = 'later'\nopen('f.txt', 'w').write('later')", conversation, checkpoint="cp")
    stored = sorted(name for name in objects(s3_endpoint, url) if name.startswith("checkpoints/"))
    second = _sharing_the_secret(first, state_dir / "second")

    async with _serving(second, url, sandbox_runtime) as (service, client):
        restored = await _run(client, "print(value, open('f.txt').read())", conversation, reset="cp")
        key = service.workspaces.key("default", conversation)
        await service.engine.end_session(key)
        with sqlite3.connect(second / "metadata.sqlite3") as db:
            db.execute("UPDATE conversations SET last_used = 0")  # idle since 1970
        assert service.mirror is not None
        report = await anyio.to_thread.run_sync(
            sweep,
            service.workspaces,
            service.metadata,
            service.workspace_settings,
            time.time(),
            (),
            service.mirror.forget,
        )
        left = objects(s3_endpoint, url)

    assert made["status"] == "success" and saved["status"] == "success", (made, saved)
    assert stored == [f"checkpoints/{key}/cp.tar"]
    assert restored["status"] == "success", restored
    assert (restored["stdout"], restored["session"]) == ("saved saved\n", "resumed")
    assert restored["checkpoint"]["restored"]["variables"] is True
    assert (report.idle, report.failed) == ([key], [])
    assert left == {}  # the conversation, its checkpoint's files and its variables: all gone


async def test_a_checkpoint_deleted_by_a_server_that_never_held_it_is_deleted_from_the_store(
    state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    url, conversation = store_url(), new_conversation()
    first = state_dir / "first"
    async with _serving(first, url, sandbox_runtime) as (service, client):
        made = await _run(client, "value = 'saved'", conversation)
        saved = [await _run(client, "pass", conversation, checkpoint=name) for name in ("a", "b")]
        key = service.workspaces.key("default", conversation)
    stored = sorted(objects(s3_endpoint, url))
    second = _sharing_the_secret(first, state_dir / "second")

    async with _serving(second, url, sandbox_runtime) as (_, client):
        deleted = await _run(client, "print('ran')", conversation, checkpoint="-a")
    left = sorted(objects(s3_endpoint, url))

    assert made["status"] == "success" and [one["status"] for one in saved] == ["success"] * 2, (made, saved)
    a_state, b_state = (f"parked/{state_key(key, name)}.state" for name in ("a", "b"))
    assert {f"checkpoints/{key}/a.tar", f"checkpoints/{key}/b.tar", a_state, b_state} <= set(stored)
    assert (deleted["status"], deleted["stdout"]) == ("success", "ran\n"), deleted
    assert deleted["checkpoint"]["deleted"] == {"name": "a", "bytes": 0, "checkpoints": ["b"]}  # none of it here
    assert f"checkpoints/{key}/a.tar" not in left and a_state not in left
    assert {f"checkpoints/{key}/b.tar", b_state} <= set(left)
