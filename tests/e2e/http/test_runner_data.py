"""The earlier code runner's ``.env`` with its data: ``SANDBOX_ROOT`` and ``FILE_SECRET`` honoured.

The test lays out a ``SANDBOX_ROOT`` as that runner did (``{root}/{sha256(conversationId +
FILE_SECRET)}/``, hex), starts a real server with that ``.env`` only, and checks that the old
permanent links ``/files/{digest}/{name}`` keep downloading (before and after the conversation is
used again), that a run naming the conversation finds its files in ``/data``, that the import is
logged, and that a restart does not import twice.
"""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
from pathlib import Path

import anyio
import httpx2
import pytest

from mcp_test_helpers import CALL_BOUND, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "runner-token-0123456789abcdef"
SECRET = "the-runners-file-secret"


def _runner_root(root: Path, conversation: str) -> str:
    digest = hashlib.sha256((conversation + SECRET).encode()).hexdigest()
    directory = root / digest
    (directory / "sub").mkdir(parents=True)
    (directory / "data.csv").write_bytes(b"name,age\nAlice,30\n")
    (directory / "sub" / "note.txt").write_bytes(b"nested")
    (directory / "escape").symlink_to("/etc/passwd")
    (root / "not-a-digest").mkdir()
    return digest


async def _run(web: httpx2.AsyncClient, base: str, arguments: dict[str, object], tenant_token: str = TOKEN) -> dict:  # type: ignore[type-arg]
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_code", "arguments": arguments}}
    reply = await web.post(f"{base}/mcp", json=body, headers={"Authorization": f"Bearer {tenant_token}"})
    assert reply.status_code == 200, reply.text
    result: dict = reply.json()["result"]  # type: ignore[type-arg]
    return result


async def test_the_runners_data_is_imported_and_its_old_links_keep_downloading(
    state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    root = tmp_path / "sandbox-root"
    conversation = f"session-{uuid.uuid4().hex[:8]}"
    digest = _runner_root(root, conversation)
    env = {"MCP_API_TOKEN": TOKEN, "SANDBOX_ROOT": str(root), "FILE_SECRET": SECRET}
    log = tmp_path / "server.log"
    async with (
        http_server(state_dir, env=env, runtime=sandbox_runtime, log_path=log) as base,
        httpx2.AsyncClient(timeout=CALL_BOUND) as web,
    ):
        with anyio.fail_after(CALL_BOUND * 3):
            # Before the conversation is used again: the old link, with no token, as there.
            before = await web.get(f"{base}/files/{digest}/data.csv")
            nested = await web.get(f"{base}/files/{digest}/sub/note.txt")
            escaped = await web.get(f"{base}/files/{digest}/escape")
            unknown = await web.get(f"{base}/files/{'0' * 64}/data.csv")
            ran = await _run(
                web,
                base,
                {"conversationId": conversation, "language": "python", "code": "print(open('/data/data.csv').read())"},
            )
            after = await web.get(f"{base}/files/{digest}/data.csv")
            ranged = await web.get(f"{base}/files/{digest}/data.csv", headers={"Range": "bytes=0-3"})
    assert before.status_code == 200
    assert before.content == b"name,age\nAlice,30\n"
    assert nested.content == b"nested"
    assert escaped.status_code == 404  # the symlink was not imported
    assert unknown.status_code == 404
    assert not ran["isError"], ran
    assert "Alice,30" in ran["structuredContent"]["stdout"]
    assert {"data.csv", "sub/note.txt"} <= {f["name"] for f in ran["structuredContent"]["files"]}
    assert after.status_code == 200
    assert after.content == b"name,age\nAlice,30\n"
    assert ranged.status_code == 206
    assert ranged.content == b"name"
    text = log.read_text(errors="replace")
    assert "1 conversations imported now (2 files, 24 bytes, 1 skipped), 0 before" in text

    # A restart imports nothing twice, and the links still answer.
    log2 = tmp_path / "server2.log"
    async with (
        http_server(state_dir, env=env, runtime=sandbox_runtime, log_path=log2) as base,
        httpx2.AsyncClient(timeout=CALL_BOUND) as web,
    ):
        with anyio.fail_after(CALL_BOUND):
            again = await web.get(f"{base}/files/{digest}/data.csv")
    assert again.content == b"name,age\nAlice,30\n"
    assert "0 conversations imported now (0 files, 0 bytes, 0 skipped), 1 before" in log2.read_text(errors="replace")


async def test_the_import_command_copies_once_and_says_what_it_copied(tmp_path: Path) -> None:
    root = tmp_path / "sandbox-root"
    digest = _runner_root(root, "session-cli")
    env = {
        **os.environ,
        "MCP_SANDBOX_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_ROOT": str(root),
        "FILE_SECRET": SECRET,
    }
    command = [sys.executable, "-m", "mcp_sandbox", "import-runner-data"]
    with anyio.fail_after(CALL_BOUND):
        first = await anyio.run_process(command, env=env)
        second = await anyio.run_process(command, env=env)
        refused = await anyio.run_process(command, env={**env, "FILE_SECRET": ""}, check=False)
    assert first.stdout.decode() == f"{digest}: 2 files, 24 bytes, 1 skipped (not regular files)\n"
    assert second.stdout.decode() == f"{digest}: imported before\n"
    assert refused.returncode == 2
    assert b"FILE_SECRET" in refused.stderr


async def test_another_tenant_naming_the_conversation_does_not_get_the_imported_files(
    state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    root = tmp_path / "sandbox-root"
    conversation = f"session-{uuid.uuid4().hex[:8]}"
    digest = _runner_root(root, conversation)
    other = "other-tenant-token-0123456789"
    config = tmp_path / "tenants.toml"
    config.write_text(f'[auth]\ntokens = [{{ tenant = "bob", token = "{other}" }}]\n')
    env = {"MCP_API_TOKEN": TOKEN, "SANDBOX_ROOT": str(root), "FILE_SECRET": SECRET}
    code = "import os; print(sorted(os.listdir('/data')))"
    async with (
        http_server(state_dir, "--config", str(config), env=env, runtime=sandbox_runtime) as base,
        httpx2.AsyncClient(timeout=CALL_BOUND) as web,
    ):
        with anyio.fail_after(CALL_BOUND * 3):
            bob = await _run(web, base, {"conversationId": conversation, "language": "python", "code": code}, other)
            link = await web.get(f"{base}/files/{digest}/data.csv")  # still the imported copy, not adopted
            owner = await _run(web, base, {"conversationId": conversation, "language": "python", "code": code})
    assert "data.csv" not in bob["structuredContent"]["stdout"], bob
    assert link.content == b"name,age\nAlice,30\n"
    assert "data.csv" in owner["structuredContent"]["stdout"], owner
