"""``forkFrom`` on the reflink volume (``workspaces.volume_bytes``), through the tools on real bwrap.

The fork tests of test_fork.py that tell the ways of copying apart run again here with the
state directory's workspaces on the volume (pytest collects the imported tests with this
module's ``client``): a fork's first run born of a session-ready sandbox (its slot, in ``runs/``
on the volume, renamed over the fork's directory), isolation after the fork, a fork of a fork.
Beside them, a fork whose shared blocks each side then writes in place (the copy-on-write path),
whose sandbox finds an ordinary ``/workspace`` (the conformance suite's workspace checks), and
whose files the service lists; and, over HTTP with an object store, a fork's files written back
to the store and served by their links.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client

from e2e.conversations.test_fork import (
    test_a_fork_of_a_fork_and_a_checkpoint_rolled_back,
    test_a_fork_sees_the_sources_variables_functions_modules_and_files,
    test_a_forks_first_run_is_born_of_a_session_ready_sandbox_with_the_variables,
    test_writes_after_a_fork_stay_on_their_side,
)
from mcp_sandbox.volume import VOLUME_DIR, release_volume
from mcp_test_helpers import (
    auth_tokens,
    http_server,
    memory_client,
    run_ok,
    run_over_http,
    upload,
)
from s3_helpers import files, s3_env, store_url
from test_volume import require_volume

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"

__all__ = [
    "test_a_fork_of_a_fork_and_a_checkpoint_rolled_back",
    "test_a_fork_sees_the_sources_variables_functions_modules_and_files",
    "test_a_forks_first_run_is_born_of_a_session_ready_sandbox_with_the_variables",
    "test_writes_after_a_fork_stay_on_their_side",
]


@pytest.fixture
async def client(state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    require_volume()
    try:
        async with memory_client(state_dir, sandbox_runtime, volume_bytes=2 << 30) as client:
            yield client
    finally:
        release_volume(state_dir)


_CHECKS = """
import os, stat
print(os.getcwd(), os.path.samefile('/workspace', '/data'), sorted(os.listdir('/workspace')))
with open('/workspace/blocks.bin', 'r+b') as file:
    file.write(b'FORK')
try:
    os.link('/etc/passwd', '/workspace/passwd')
    print('linked')
except OSError as error:
    print('no link', error.errno)
os.makedirs('/workspace/made/here')
open('/workspace/made/here/new.txt', 'w').write('new in the fork')
print(os.stat('/workspace/made/here/new.txt').st_uid == os.getuid(), os.statvfs('/workspace').f_bsize > 0)
"""


async def test_a_fork_on_the_volume_is_an_ordinary_workspace_whose_shared_blocks_each_side_writes_in_place(
    client: Client, state_dir: Path
) -> None:
    source, fork = f"c-{uuid.uuid4().hex}", f"c-{uuid.uuid4().hex}"
    await run_ok(client, "open('blocks.bin', 'wb').write(b'0123456789' * 100_000)", source)

    forked = await run_ok(client, _CHECKS, fork, forkFrom=source)
    await run_ok(client, "with open('blocks.bin', 'r+b') as file:\n    file.write(b'SRC')", source)
    in_fork = await run_ok(client, "print(open('blocks.bin', 'rb').read(12))", fork)
    in_source = await run_ok(client, "print(open('blocks.bin', 'rb').read(12))", source)

    assert forked["fork"]["reflinked"] == forked["fork"]["files"] == 1
    lines = forked["stdout"].splitlines()
    assert lines[0] == "/workspace True ['blocks.bin']"
    assert lines[1].startswith("no link ")  # a hard link out of the workspace fails, as on any workspace
    assert lines[2] == "True True"
    assert in_fork["stdout"] == "b'FORK45678901'\n"
    assert in_source["stdout"] == "b'SRC345678901'\n"
    assert sorted(entry["name"] for entry in in_fork["files"]) == ["blocks.bin", "made/here/new.txt"]
    workspaces = state_dir / VOLUME_DIR / "workspaces"
    owners = {path.stat().st_uid for path in workspaces.rglob("*")}
    assert owners and 0 not in owners  # every entry the tenant's uid's, none the (root) server's


async def test_a_fork_on_the_volume_is_written_back_to_the_store_and_served_by_its_link(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    require_volume()
    url, source, fork = store_url(), f"c-{uuid.uuid4().hex}", f"c-{uuid.uuid4().hex}"
    config = tmp_path / "tokens.toml"
    config.write_text(auth_tokens({"alice": ALICE}))
    env = {**s3_env(s3_endpoint), "MCP_SANDBOX_OBJECT_STORE_URL": url, "MCP_SANDBOX_VOLUME_BYTES": str(2 << 30)}
    try:
        async with http_server(state_dir, "--config", str(config), env=env, runtime=sandbox_runtime) as base:
            assert (await upload(base, ALICE, source, "in/data.txt", b"uploaded to the source")).status_code == 201
            await run_over_http(base, ALICE, "x = 1", conversationId=source)
            forked = await run_over_http(
                base, ALICE, "open('out.txt', 'w').write('the fork wrote')", conversationId=fork, forkFrom=source
            )
            links = {entry["name"]: entry["url"] for entry in forked["files"]}
            async with httpx2.AsyncClient(trust_env=False) as web:
                served = await web.get(links["in/data.txt"])
    finally:
        release_volume(state_dir)

    assert forked["status"] == "success" and forked["fork"]["reflinked"] == 1, forked
    assert (served.status_code, served.content) == (200, b"uploaded to the source")
    stored: dict[str, dict[str, bytes]] = {}
    for name, body in files(s3_endpoint, url).items():
        _, key, file = name.split("/", 2)
        stored.setdefault(key, {})[file] = body
    assert sorted(stored.values(), key=len) == [
        {"in/data.txt": b"uploaded to the source"},
        {"in/data.txt": b"uploaded to the source", "out.txt": b"the fork wrote"},
    ]
