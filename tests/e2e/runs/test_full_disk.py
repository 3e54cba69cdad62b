"""A full disk under the state directory: every tenant is told the server's disk is full, no host
path reaches it, nothing is half-created, and the server serves again once space is freed.

The state directory is a real small filesystem (a tmpfs mounted for the test, as root), filled
by a file the test writes beside the server's.
"""

from __future__ import annotations

import base64
import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_test_helpers import CALL_BOUND, auth_tokens, fill_disk, http_client, http_server, new_conversation, upload

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox,
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]

TOKEN = "full-disk-token-0123456789abcdef"
FULL = "disk is full"


@pytest.fixture
def small_state_dir(state_dir: Path) -> Iterator[Path]:
    """``state_dir`` as a 24 MiB tmpfs of its own."""
    state_dir.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(state_dir)], check=True)
    try:
        yield state_dir
    finally:
        subprocess.run(["umount", "-l", str(state_dir)], check=True)


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    with anyio.fail_after(CALL_BOUND * 2):
        result = await client.call_tool(tool, arguments)
    text = "\n".join(getattr(block, "text", "") for block in result.content)
    return bool(result.is_error), text, result.structured_content or {}


REMEMBER = """
from mcp import runtime
try:
    save_memory("second", "x" * 900_000)
except runtime.MCPError as error:
    print("MCPError", error.kind, error)
"""


def _rows(state_dir: Path) -> set[str]:
    with sqlite3.connect(f"file:{state_dir / 'metadata.sqlite3'}?mode=ro", uri=True) as db:
        return {key for (key,) in db.execute("SELECT key FROM conversations")}


def _directories(state_dir: Path) -> set[str]:
    return {entry.name for entry in (state_dir / "workspaces").iterdir()}


async def test_a_full_disk_says_so_without_host_paths_and_the_server_recovers(
    small_state_dir: Path, sandbox_runtime: Path | None
) -> None:
    state_dir = small_state_dir
    config = state_dir.parent / f"full-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(auth_tokens({"alice": TOKEN}))
    existing, fresh = new_conversation(), new_conversation()
    write = "open('/workspace/out.txt', 'w').write('x' * 1000); print('wrote')"
    async with http_server(state_dir, "--config", str(config), runtime=sandbox_runtime) as base:
        async with http_client(base, TOKEN) as client:
            failed, text, _ = await _call(
                client, "run_python", {"code": "save_memory('first', 1)", "conversationId": existing}
            )
            assert not failed, text
            filler = fill_disk(state_dir)
            seen: list[str] = []
            try:
                for tool, arguments in [
                    ("run_python", {"code": write, "conversationId": fresh}),
                    ("run_code", {"code": write, "language": "python", "conversationId": fresh}),
                    ("run_python", {"code": write, "conversationId": existing}),
                    ("upload_file", {"conversationId": existing, "filename": "up.bin", "content": "eHl6" * 1000}),
                    ("upload_file", {"conversationId": fresh, "filename": "up.bin", "content": "eHl6"}),
                ]:
                    failed, text, data = await _call(client, tool, arguments)
                    seen.append(text + repr(data))
                    assert failed, (tool, text)
                    assert FULL in text, (tool, text)
                # A run without a conversation stores nothing: it may run, or fail saying so.
                failed, text, data = await _call(client, "run_python", {"code": write})
                seen.append(text + repr(data))
                assert not failed or FULL in text, text
                response = await upload(base, TOKEN, existing, "big.bin", b"b" * (1 << 20))
                seen.append(response.text)
                assert response.status_code == 507, response.text
                assert FULL in response.json()["error"]
                # Room enough to start a run, not for what its code saves in the tenant's library.
                os.truncate(filler, filler.stat().st_size - (256 << 10))
                failed, text, data = await _call(client, "run_python", {"code": REMEMBER})
                seen.append(text + repr(data))
                assert "MCPError unavailable" in data["stdout"] and FULL in data["stdout"], (text, data)
                for text in seen:
                    assert str(state_dir) not in text and str(state_dir.parent) not in text, text
                # Nothing half-created: the new conversation has neither a row nor a directory.
                assert _rows(state_dir) == _directories(state_dir)
            finally:
                filler.unlink()

            failed, text, data = await _call(client, "run_python", {"code": write, "conversationId": fresh})
            assert not failed and "wrote" in text, text
            assert [entry["name"] for entry in data["files"]] == ["out.txt"]
            content = base64.b64encode(b"xyz").decode()
            failed, text, _ = await _call(
                client, "upload_file", {"conversationId": existing, "filename": "up.bin", "content": content}
            )
            assert not failed, text
            assert (await upload(base, TOKEN, existing, "big.bin", b"b" * (1 << 20))).status_code == 201
        assert _rows(state_dir) == _directories(state_dir)
