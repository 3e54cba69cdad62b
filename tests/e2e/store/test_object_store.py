"""Workspaces in an S3-compatible object store (``object_store_url``), against a real SeaweedFS.

Real ``serve --transport http`` processes (and the service in process, for its start-up and its
sweep): what a run writes and what an upload stores is in the store before the answer, also when
a conversation's first uploads come at once; a run that changes nothing uploads nothing and a
deleted file leaves the store; a store that is wrong or gone is said, at start or in the answer;
retention deletes a conversation's objects. Write-backs between calls are in
test_idle_write_backs.py, two replicas over one store in test_store_replicas.py.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from mcp_sandbox import load_settings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.server.service import open_service
from mcp_test_helpers import CALL_BOUND, free_port, http_client, http_server, new_conversation, run_over_http, upload
from postgres_helpers import Cluster
from s3_helpers import bucket, delete_file, files, objects, s3_env, store_url

from .stores import ALICE, store_config, store_env, workspace_files

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_uploads_and_run_outputs_are_in_the_store_before_the_answer_and_agree_with_the_index(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, state = store_url(), state_dir
    conversation = new_conversation()
    env = store_env(s3_endpoint, url)
    async with http_server(state, "--config", str(store_config(tmp_path)), env=env, runtime=sandbox_runtime) as base:
        reply = await upload(base, ALICE, conversation, "in/data.txt", b"uploaded bytes")
        assert reply.status_code == 201
        assert workspace_files(s3_endpoint, url) == {"in/data.txt": b"uploaded bytes"}
        async with http_client(base, ALICE) as client:
            arguments = {"conversationId": conversation, "filename": "tool.txt", "content": "dG9vbA=="}
            with anyio.fail_after(CALL_BOUND):
                result = await client.call_tool("upload_file", arguments)
        assert not result.is_error
        assert workspace_files(s3_endpoint, url) == {"in/data.txt": b"uploaded bytes", "tool.txt": b"tool"}

        code = "open('out.txt', 'w').write('x' * 5000); print(open('in/data.txt').read())"
        data = await run_over_http(base, ALICE, code, conversationId=conversation)
        assert data["stdout"] == "uploaded bytes\n"
        expected = {"in/data.txt": b"uploaded bytes", "tool.txt": b"tool", "out.txt": b"x" * 5000}
        assert workspace_files(s3_endpoint, url) == expected

    # What the quota counts in the metadata index is what the store holds.
    with sqlite3.connect(state / "metadata.sqlite3") as db:
        ((indexed_bytes, indexed_files),) = db.execute("SELECT bytes, files FROM conversations").fetchall()
    stored = workspace_files(s3_endpoint, url)
    assert (indexed_bytes, indexed_files) == (sum(len(body) for body in stored.values()), len(stored))


async def test_concurrent_first_uploads_of_a_conversation_leave_every_file_in_the_store_and_the_index(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    # The first requests of a conversation each restored it from the store, the later ones removing
    # files the earlier ones had stored and not yet written back; and an upload's listing, recorded
    # after another upload's newer one, made the index lose a file (issue 37).
    url, conversation, count, database = store_url(), new_conversation(), 16, postgres.create_database()
    env = store_env(s3_endpoint, url, MCP_SANDBOX_TENANT_UPLOADS=str(count), MCP_SANDBOX_DATABASE_URL=database)
    async with http_server(
        state_dir, "--config", str(store_config(tmp_path)), env=env, runtime=sandbox_runtime
    ) as base:
        replies: list[int] = []

        async def send(index: int) -> None:
            replies.append((await upload(base, ALICE, conversation, f"f{index}.bin", bytes(100 + index))).status_code)

        with anyio.fail_after(CALL_BOUND):
            async with anyio.create_task_group() as group:
                for index in range(count):
                    group.start_soon(send, index)
        assert replies == [201] * count
        stored = workspace_files(s3_endpoint, url)
        assert sorted(stored) == sorted(f"f{index}.bin" for index in range(count))
        expected = (sum(len(body) for body in stored.values()), count)
        with psycopg.connect(database, autocommit=True) as db:
            assert db.execute("SELECT bytes, files FROM conversations").fetchall() == [expected]
            assert db.execute("SELECT sum(size), count(*) FROM files").fetchall() == [expected]


async def test_a_run_that_changes_nothing_uploads_nothing_and_deleted_files_leave_the_store(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, conversation = store_url(), new_conversation()
    env = store_env(s3_endpoint, url)
    async with http_server(
        state_dir, "--config", str(store_config(tmp_path)), env=env, runtime=sandbox_runtime
    ) as base:
        await run_over_http(
            base, ALICE, "open('a.txt', 'w').write('a'); open('b.txt', 'w').write('b')", conversationId=conversation
        )
        assert set(workspace_files(s3_endpoint, url)) == {"a.txt", "b.txt"}
        # Removed behind the server's back: a run that changes nothing must not put it there again.
        (name,) = [name for name in files(s3_endpoint, url) if name.endswith("/a.txt")]
        delete_file(s3_endpoint, url, name)
        await run_over_http(base, ALICE, "print(sorted(__import__('os').listdir()))", conversationId=conversation)
        assert set(workspace_files(s3_endpoint, url)) == {"b.txt"}

        await run_over_http(base, ALICE, "import os; os.remove('b.txt')", conversationId=conversation)
        assert workspace_files(s3_endpoint, url) == {}


async def test_a_bad_or_unreachable_store_is_a_start_up_error_naming_the_setting(
    state_dir: Path, sandbox_runtime: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="object_store_url"):
        load_settings(env={"MCP_SANDBOX_OBJECT_STORE_URL": "https://bucket.example/prefix"}, flags={})

    for name, value in s3_env(f"http://127.0.0.1:{free_port()}").items():  # nothing listens there
        monkeypatch.setenv(name, value)
    flags: dict[str, Any] = {"state_dir": str(state_dir), "discover_servers": False, "object_store_url": store_url()}
    if sandbox_runtime is not None:
        flags["python_runtime"] = str(sandbox_runtime)
    settings = load_settings(env={}, flags=flags)
    with anyio.fail_after(60), pytest.raises(ConfigError, match="object_store_url") as raised:
        async with open_service(settings, http=True):
            pass
    assert s3_env("")["AWS_SECRET_ACCESS_KEY"] not in str(raised.value)


async def test_retention_deletes_a_conversations_objects_with_its_directory(
    state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    url = store_url()
    flags: dict[str, Any] = {"state_dir": str(state_dir), "discover_servers": False, "object_store_url": url}
    if sandbox_runtime is not None:
        flags["python_runtime"] = str(sandbox_runtime)
    settings = load_settings(env={}, flags=flags)
    async with open_service(settings, http=True) as service:
        key = service.workspaces.key("alice", new_conversation())
        with service.using(key):
            await service.storage.touch(key, "alice")
            await anyio.to_thread.run_sync(service.workspaces.write_file, key, "kept.txt", b"kept")
            await service.storage.refresh_files(key)
            await service.storage.write_back(key)
        assert set(workspace_files(s3_endpoint, url)) == {"kept.txt"}
        with sqlite3.connect(state_dir / "metadata.sqlite3") as db:
            db.execute("UPDATE conversations SET last_used = 0")  # idle since 1970
        await service.storage.sweep(service.workspace_settings)
        assert objects(s3_endpoint, url) == {}
        assert not service.workspaces.directory(key).exists()


async def test_a_store_gone_mid_service_refuses_uploads_and_warns_in_run_results(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    name = f"gone-{uuid.uuid4().hex[:12]}"
    bucket(s3_endpoint, name, exists=True)
    conversation, env = new_conversation(), store_env(s3_endpoint, f"s3://{name}/p")
    async with http_server(
        state_dir, "--config", str(store_config(tmp_path)), env=env, runtime=sandbox_runtime
    ) as base:
        first = await upload(base, ALICE, conversation, "before.txt", b"kept")
        assert first.status_code == 201, first.text
        bucket(s3_endpoint, name, exists=False)  # the store loses the bucket while the server runs

        refused = await upload(base, ALICE, conversation, "after.txt", b"not acknowledged")
        assert refused.status_code == 409
        data = await run_over_http(base, ALICE, "open('out.txt', 'w').write('x')", conversationId=conversation)
        assert data["status"] == "success"
        assert data["warning"]  # the answer says its files were not saved
