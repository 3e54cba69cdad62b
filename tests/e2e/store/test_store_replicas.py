"""Two replicas over one object store, against a real SeaweedFS and one PostgreSQL database.

Real ``serve --transport http`` processes, each with its own state directory: they see the same
files, saved tools and memories and serve each other's signed links, and the earlier runner's
links of files adopted through one of them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest

from mcp_test_helpers import CALL_BOUND, bearer_web, http_server, new_conversation, run_over_http, upload
from postgres_helpers import Cluster
from s3_helpers import store_url

from .stores import ALICE, store_config, store_env, workspace_files

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_two_replicas_see_the_same_files_and_serve_each_others_links(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url, conversation, config = store_url(), new_conversation(), store_config(tmp_path)
    env = store_env(s3_endpoint, url, MCP_SANDBOX_DATABASE_URL=postgres.create_database())
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
        assert set(workspace_files(s3_endpoint, url)) == {"made.txt", "up.bin"}

        # Saved tools and memories: saved through one replica, used (then deleted) through the other.
        save = "def double(x):\n    return 2 * x\nsave_tool(double)\nsave_memory('region', 'north')"
        await run_over_http(first, ALICE, save)
        used = await run_over_http(second, ALICE, "print(saved.double(21), load_memory('region'))")
        assert used["stdout"] == "42 north\n"
        await run_over_http(second, ALICE, "delete_tool('double')")
        listed = await run_over_http(first, ALICE, "print(list_saved_tools(), list_memories())")
        assert listed["stdout"] == "[] ['region']\n"


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
    env = store_env(s3_endpoint, url, MCP_SANDBOX_DATABASE_URL=postgres.create_database(), MCP_API_TOKEN=token)
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
        stored = workspace_files(s3_endpoint, url)
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
