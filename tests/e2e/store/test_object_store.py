"""Workspaces in an S3-compatible object store (``object_store_url``), against a real SeaweedFS.

Real ``serve --transport http`` processes: what a run writes and what an upload stores is in the
store before the answer; a run that changes nothing uploads nothing and a deleted file leaves the
store; what a session writes after its run answered reaches the store while it is idle and
when the server stops; two replicas (their own state directories, one PostgreSQL database, one
store) see the same files and serve each other's signed links, and the earlier runner's links
of files adopted through one of them.
"""

from __future__ import annotations

import hashlib
import sqlite3
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import psycopg
import pytest

from mcp_sandbox import load_settings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.server.service import open_service
from mcp_test_helpers import (
    CALL_BOUND,
    auth_tokens,
    bearer_web,
    free_port,
    http_client,
    http_server,
    new_conversation,
    poll,
    run_over_http,
    upload,
)
from postgres_helpers import Cluster
from s3_helpers import bucket, delete_file, files, objects, s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"


def _config(directory: Path) -> Path:
    path = directory / f"objects-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(auth_tokens({"alice": ALICE}))
    return path


def _files(endpoint: str, url: str) -> dict[str, bytes]:
    """The store's workspace files under ``url``: {file name: content} (one conversation's)."""
    found = files(endpoint, url)
    return {name.split("/", 2)[2]: data for name, data in found.items() if name.startswith("workspaces/")}


def _server_env(endpoint: str, url: str, **more: str) -> dict[str, str]:
    return {**s3_env(endpoint), "MCP_SANDBOX_OBJECT_STORE_URL": url, **more}


async def test_uploads_and_run_outputs_are_in_the_store_before_the_answer_and_agree_with_the_index(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, state = store_url(), state_dir
    conversation = new_conversation()
    env = _server_env(s3_endpoint, url)
    async with http_server(state, "--config", str(_config(tmp_path)), env=env, runtime=sandbox_runtime) as base:
        reply = await upload(base, ALICE, conversation, "in/data.txt", b"uploaded bytes")
        assert reply.status_code == 201
        assert _files(s3_endpoint, url) == {"in/data.txt": b"uploaded bytes"}
        async with http_client(base, ALICE) as client:
            arguments = {"conversationId": conversation, "filename": "tool.txt", "content": "dG9vbA=="}
            with anyio.fail_after(CALL_BOUND):
                result = await client.call_tool("upload_file", arguments)
        assert not result.is_error
        assert _files(s3_endpoint, url) == {"in/data.txt": b"uploaded bytes", "tool.txt": b"tool"}

        code = "open('out.txt', 'w').write('x' * 5000); print(open('in/data.txt').read())"
        data = await run_over_http(base, ALICE, code, conversationId=conversation)
        assert data["stdout"] == "uploaded bytes\n"
        expected = {"in/data.txt": b"uploaded bytes", "tool.txt": b"tool", "out.txt": b"x" * 5000}
        assert _files(s3_endpoint, url) == expected

    # What the quota counts in the metadata index is what the store holds.
    with sqlite3.connect(state / "metadata.sqlite3") as db:
        ((indexed_bytes, indexed_files),) = db.execute("SELECT bytes, files FROM conversations").fetchall()
    stored = _files(s3_endpoint, url)
    assert (indexed_bytes, indexed_files) == (sum(len(body) for body in stored.values()), len(stored))


async def test_concurrent_first_uploads_of_a_conversation_leave_every_file_in_the_store_and_the_index(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    # The first requests of a conversation each restored it from the store, the later ones removing
    # files the earlier ones had stored and not yet written back; and an upload's listing, recorded
    # after another upload's newer one, made the index lose a file (issue 37).
    url, conversation, count, database = store_url(), new_conversation(), 16, postgres.create_database()
    env = _server_env(s3_endpoint, url, MCP_SANDBOX_TENANT_UPLOADS=str(count), MCP_SANDBOX_DATABASE_URL=database)
    async with http_server(state_dir, "--config", str(_config(tmp_path)), env=env, runtime=sandbox_runtime) as base:
        replies: list[int] = []

        async def send(index: int) -> None:
            replies.append((await upload(base, ALICE, conversation, f"f{index}.bin", bytes(100 + index))).status_code)

        with anyio.fail_after(CALL_BOUND):
            async with anyio.create_task_group() as group:
                for index in range(count):
                    group.start_soon(send, index)
        assert replies == [201] * count
        stored = _files(s3_endpoint, url)
        assert sorted(stored) == sorted(f"f{index}.bin" for index in range(count))
        expected = (sum(len(body) for body in stored.values()), count)
        with psycopg.connect(database, autocommit=True) as db:
            assert db.execute("SELECT bytes, files FROM conversations").fetchall() == [expected]
            assert db.execute("SELECT sum(size), count(*) FROM files").fetchall() == [expected]


async def test_a_run_that_changes_nothing_uploads_nothing_and_deleted_files_leave_the_store(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, conversation = store_url(), new_conversation()
    env = _server_env(s3_endpoint, url)
    async with http_server(state_dir, "--config", str(_config(tmp_path)), env=env, runtime=sandbox_runtime) as base:
        await run_over_http(
            base, ALICE, "open('a.txt', 'w').write('a'); open('b.txt', 'w').write('b')", conversationId=conversation
        )
        assert set(_files(s3_endpoint, url)) == {"a.txt", "b.txt"}
        # Removed behind the server's back: a run that changes nothing must not put it there again.
        (name,) = [name for name in files(s3_endpoint, url) if name.endswith("/a.txt")]
        delete_file(s3_endpoint, url, name)
        await run_over_http(base, ALICE, "print(sorted(__import__('os').listdir()))", conversationId=conversation)
        assert set(_files(s3_endpoint, url)) == {"b.txt"}

        await run_over_http(base, ALICE, "import os; os.remove('b.txt')", conversationId=conversation)
        assert _files(s3_endpoint, url) == {}


async def test_two_replicas_see_the_same_files_and_serve_each_others_links(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url, conversation, config = store_url(), new_conversation(), _config(tmp_path)
    env = _server_env(s3_endpoint, url, MCP_SANDBOX_DATABASE_URL=postgres.create_database())
    async with (
        http_server(state_dir, "--config", str(config), env=env, runtime=sandbox_runtime) as first,
        http_server(state_dir.with_name("two"), "--config", str(config), env=env, runtime=sandbox_runtime) as second,
    ):
        assert (await upload(first, ALICE, conversation, "up.bin", b"\x00\x01" * 1000)).status_code == 201
        made = await run_over_http(
            first, ALICE, "open('made.txt', 'w').write('made on one')", conversationId=conversation
        )
        (link,) = [entry["url"] for entry in made["files"] if entry["name"] == "made.txt"]

        # The second replica has never seen the conversation: its link and its files come from the store.
        other = second + urlsplit(link).path + (f"?{urlsplit(link).query}" if urlsplit(link).query else "")
        async with bearer_web(None) as web:
            response = await web.get(other)
        assert (response.status_code, response.content) == (200, b"made on one")

        code = "print(open('made.txt').read(), len(open('up.bin', 'rb').read()))"
        data = await run_over_http(second, ALICE, code, conversationId=conversation)
        assert data["stdout"] == "made on one 2000\n"
        # The same secret on both: the conversation has the same key, so one copy in the store.
        assert set(_files(s3_endpoint, url)) == {"made.txt", "up.bin"}

        # Saved tools and memories: saved through one replica, used (then deleted) through the other.
        save = "def double(x):\n    return 2 * x\nsave_tool(double)\nsave_memory('region', 'north')"
        await run_over_http(first, ALICE, save)
        used = await run_over_http(second, ALICE, "print(saved.double(21), load_memory('region'))")
        assert used["stdout"] == "42 north\n"
        await run_over_http(second, ALICE, "delete_tool('double')")
        listed = await run_over_http(first, ALICE, "print(list_saved_tools(), list_memories())")
        assert listed["stdout"] == "[] ['region']\n"


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
        assert set(_files(s3_endpoint, url)) == {"kept.txt"}
        with sqlite3.connect(state_dir / "metadata.sqlite3") as db:
            db.execute("UPDATE conversations SET last_used = 0")  # idle since 1970
        await service.storage.sweep(service.settings.workspaces)
        assert objects(s3_endpoint, url) == {}
        assert not service.workspaces.directory(key).exists()


async def test_a_store_gone_mid_service_refuses_uploads_and_warns_in_run_results(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    name = f"gone-{uuid.uuid4().hex[:12]}"
    bucket(s3_endpoint, name, exists=True)
    conversation, env = new_conversation(), _server_env(s3_endpoint, f"s3://{name}/p")
    async with http_server(state_dir, "--config", str(_config(tmp_path)), env=env, runtime=sandbox_runtime) as base:
        first = await upload(base, ALICE, conversation, "before.txt", b"kept")
        assert first.status_code == 201, first.text
        bucket(s3_endpoint, name, exists=False)  # the store loses the bucket while the server runs

        refused = await upload(base, ALICE, conversation, "after.txt", b"not acknowledged")
        assert refused.status_code == 409
        data = await run_over_http(base, ALICE, "open('out.txt', 'w').write('x')", conversationId=conversation)
        assert data["status"] == "success"
        assert data["warning"]  # the answer says its files were not saved


# A run that leaves a thread behind, writing a file some seconds after the run has answered.
_LATE_WRITER = """
import threading, time
def later():
    time.sleep(4)
    with open('late.txt.part', 'w') as out:
        out.write('written after the answer')
    __import__('os').rename('late.txt.part', 'late.txt')
threading.Thread(target=later, daemon=True).start()
print('started')
"""


async def test_what_a_session_writes_after_its_run_answered_reaches_the_store_while_idle(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, conversation = store_url(), new_conversation()
    env = _server_env(s3_endpoint, url, MCP_SANDBOX_WRITE_BACK_INTERVAL="1s")
    async with http_server(state_dir, "--config", str(_config(tmp_path)), env=env, runtime=sandbox_runtime) as base:
        data = await run_over_http(base, ALICE, _LATE_WRITER, conversationId=conversation)
        assert data["stdout"] == "started\n"
        assert "late.txt" not in _files(s3_endpoint, url)  # not written yet when the run answered
        # No further call: the idle write-back takes it to the store.
        with anyio.fail_after(60):
            await poll(lambda: "late.txt" in _files(s3_endpoint, url), interval=0.25)
        assert _files(s3_endpoint, url)["late.txt"] == b"written after the answer"


async def test_idle_write_backs_outlive_a_store_that_is_down_and_catch_up_once_it_is_back(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    name = f"idle-{uuid.uuid4().hex[:12]}"
    bucket(s3_endpoint, name, exists=True)
    url, conversation = f"s3://{name}/p", new_conversation()
    env = _server_env(s3_endpoint, url, MCP_SANDBOX_WRITE_BACK_INTERVAL="1s")
    log = tmp_path / "server.log"
    config = str(_config(tmp_path))
    async with http_server(state_dir, "--config", config, env=env, runtime=sandbox_runtime, log_path=log) as base:
        await run_over_http(base, ALICE, _LATE_WRITER, conversationId=conversation)
        bucket(s3_endpoint, name, exists=False)  # the store refuses every write-back from now on
        with anyio.fail_after(60):
            await poll(lambda: "idle write-back to the object store failed" in log.read_text(errors="replace"))
        # The server goes on serving, and the file waits on its disk for the store.
        assert (await run_over_http(base, ALICE, "print(6 * 7)"))["stdout"] == "42\n"
        bucket(s3_endpoint, name, exists=True)
        with anyio.fail_after(60):
            await poll(lambda: "late.txt" in _files(s3_endpoint, url), interval=0.25)
    assert _files(s3_endpoint, url)["late.txt"] == b"written after the answer"


async def test_what_a_session_wrote_since_the_last_write_back_is_stored_when_the_server_stops(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, conversation = store_url(), new_conversation()
    env = _server_env(s3_endpoint, url, MCP_SANDBOX_WRITE_BACK_INTERVAL="1h")  # no pass before the stop
    async with http_server(state_dir, "--config", str(_config(tmp_path)), env=env, runtime=sandbox_runtime) as base:
        await run_over_http(base, ALICE, _LATE_WRITER, conversationId=conversation)
        with anyio.fail_after(60):
            await poll(lambda: any((state_dir / "workspaces").glob("*/late.txt")), interval=0.25)
        assert "late.txt" not in _files(s3_endpoint, url)
    # SIGTERM: the sessions are closed, then what they left is written back before the server exits.
    assert _files(s3_endpoint, url)["late.txt"] == b"written after the answer"


async def test_the_earlier_runners_links_download_through_a_replica_that_never_held_the_files(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    token, secret, conversation = "runner-token-0123456789abcdef", "the-runners-file-secret", new_conversation()
    root = tmp_path / "sandbox-root"  # the earlier runner's data, on the first replica's disk only
    digest = hashlib.sha256((conversation + secret).encode()).hexdigest()
    (root / digest / "sub").mkdir(parents=True)
    (root / digest / "data.csv").write_bytes(b"name,age\nAlice,30\n")
    (root / digest / "sub" / "note.txt").write_bytes(b"nested")
    url = store_url()
    env = _server_env(s3_endpoint, url, MCP_SANDBOX_DATABASE_URL=postgres.create_database(), MCP_API_TOKEN=token)
    runner = {"SANDBOX_ROOT": str(root), "FILE_SECRET": secret}
    async with (
        http_server(state_dir, env={**env, **runner}, runtime=sandbox_runtime) as first,
        # Its FILE_SECRET without the disk: the links' route, served from the store.
        http_server(state_dir.with_name("two"), env={**env, "FILE_SECRET": secret}, runtime=sandbox_runtime) as second,
    ):
        # The conversation's first call adopts the runner's files on the first replica.
        data = await run_over_http(first, token, "print(open('data.csv').read())", conversationId=conversation)
        assert data["stdout"] == "name,age\nAlice,30\n\n"
        async with bearer_web(None) as web:
            with anyio.fail_after(CALL_BOUND):
                there = await web.get(f"{second}/files/{digest}/data.csv")
                nested = await web.get(f"{second}/files/{digest}/sub/note.txt")
                ranged = await web.get(f"{second}/files/{digest}/data.csv", headers={"Range": "bytes=0-3"})
                missing = await web.get(f"{second}/files/{digest}/nothing.txt")
                unknown = await web.get(f"{second}/files/{'0' * 64}/data.csv")
                climbing = await web.get(f"{second}/files/{digest}/..%2F..%2Fsecret")
        # Written and changed after the import: in the store, and not served by an old link there.
        code = "open('later.txt', 'w').write('later'); open('sub/note.txt', 'w').write('NESTED')"
        await run_over_http(first, token, code, conversationId=conversation)
        stored = _files(s3_endpoint, url)
        assert (stored["later.txt"], stored["sub/note.txt"]) == (b"later", b"NESTED")
        async with bearer_web(None) as web:
            with anyio.fail_after(CALL_BOUND):
                later = await web.get(f"{second}/files/{digest}/later.txt")
                changed = await web.get(f"{second}/files/{digest}/sub/note.txt")
                kept = await web.get(f"{second}/files/{digest}/data.csv")
    assert (later.status_code, changed.status_code, kept.status_code) == (404, 404, 200)
    assert (there.status_code, there.content) == (200, b"name,age\nAlice,30\n")
    assert (nested.status_code, nested.content) == (200, b"nested")
    assert (ranged.status_code, ranged.content) == (206, b"name")
    assert (missing.status_code, unknown.status_code) == (404, 404)
    assert climbing.status_code in (403, 404)  # refused before the route, or by it
