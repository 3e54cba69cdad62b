"""An upload cut by ``kill -9`` of the server leaves nothing a tenant sees or pays for.

A partial upload lives in ``state_dir/uploads/`` (out of the sandbox's sight and the quota's
count) until it is renamed into the workspace; a server killed mid-body leaves it there, and
the next start deletes it, together with the partial files older versions left in workspaces.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from mcp_test_helpers import (
    _server_env,
    _stop_server,
    _wait_listening,
    auth_tokens,
    free_port,
    new_conversation,
    poll,
    run_over_http,
    upload,
)

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.anyio]

TOKEN = "upload-crash-token-0123456789ab"
MIB = 1 << 20
QUOTA = 8 * MIB
BOUND = 60.0
OLD_PARTIAL = ".mcp-sandbox-upload-0123456789abcdef01234567"

# Every file under /workspace, hidden ones included, with its size.
LIST_ALL = """
import os
found = []
for top, dirs, files in os.walk('/workspace'):
    paths = [os.path.join(top, f) for f in files]
    found += [(os.path.relpath(path, '/workspace'), os.path.getsize(path)) for path in paths]
print(sorted(found))
"""


@asynccontextmanager
async def _server(state_dir: Path, config: Path, runtime: Path | None) -> AsyncIterator[tuple[str, int]]:
    """A real HTTP server; yields its base URL and pid (SIGKILL it at will; it is stopped on exit)."""
    port = free_port()
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--state-dir", str(state_dir), "--config", str(config)]
    process = await anyio.open_process(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=None,
        env=_server_env(runtime, None),
        start_new_session=True,
    )
    try:
        with anyio.fail_after(BOUND):
            await _wait_listening(process, "127.0.0.1", port)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        with anyio.CancelScope(shield=True):
            await _stop_server(process, 15.0)


def _half_upload(base: str, conversation: str, name: str, size: int) -> socket.socket:
    """Send an upload's headers and half its body, and leave the connection open."""
    host, port = base.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=BOUND)
    head = (
        f"POST /upload?conversationId={conversation}&filename={name} HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n\r\n"
    )
    connection.sendall(head.encode() + b"p" * (size // 2))
    return connection


def _staged(state_dir: Path) -> list[Path]:
    uploads = state_dir / "uploads"
    return sorted(uploads.iterdir()) if uploads.is_dir() else []


def _in_workspaces(state_dir: Path) -> list[str]:
    """Every file under ``workspaces/``, as ``<key>/<name>``."""
    root = state_dir / "workspaces"
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


async def test_an_upload_cut_by_kill_9_leaves_no_partial_and_costs_no_quota(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    config = state_dir.parent / f"upload-crash-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(f"quota_bytes = {QUOTA}\n" + auth_tokens({"alice": TOKEN}))
    conversation = new_conversation()
    async with _server(state_dir, config, sandbox_runtime) as (base, pid):
        assert (await upload(base, TOKEN, conversation, "keep.bin", b"k" * MIB)).status_code == 201
        (key,) = [name.split("/")[0] for name in _in_workspaces(state_dir)]
        cut = _half_upload(base, conversation, "big.bin", 6 * MIB)
        try:
            with anyio.fail_after(BOUND):
                await poll(lambda: sum(path.stat().st_size for path in _staged(state_dir)) >= 2 * MIB)
            # While the upload streams, a run in its conversation sees only what is committed.
            seen = await run_over_http(base, TOKEN, LIST_ALL, conversationId=conversation)
            assert seen["stdout"] == f"[('keep.bin', {MIB})]\n"
            assert _in_workspaces(state_dir) == [f"{key}/keep.bin"]
            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(BOUND):
                await poll(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid))
        finally:
            cut.close()
    assert _staged(state_dir), "the killed server's partial upload should be there before the restart"
    # What versions before uploads/ left in the workspace when killed mid-upload.
    (state_dir / "workspaces" / key / OLD_PARTIAL).write_bytes(b"o" * (3 * MIB))

    async with _server(state_dir, config, sandbox_runtime) as (base, _):
        assert _staged(state_dir) == []
        assert _in_workspaces(state_dir) == [f"{key}/keep.bin"]
        seen = await run_over_http(base, TOKEN, LIST_ALL, conversationId=conversation)
        assert seen["stdout"] == f"[('keep.bin', {MIB})]\n"
        # The quota counts what is listed: 1 MiB kept, so 6.5 MiB more fit in 8 MiB.
        stored = await upload(base, TOKEN, conversation, "after.bin", b"a" * (13 * MIB // 2))
        assert stored.status_code == 201, stored.text
        assert _staged(state_dir) == []


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


async def test_a_live_servers_partial_upload_is_not_swept_by_another_starting(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    config = state_dir.parent / f"upload-live-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(f"quota_bytes = {QUOTA}\n" + auth_tokens({"alice": TOKEN}))
    conversation = new_conversation()
    async with _server(state_dir, config, sandbox_runtime) as (base, _):
        cut = _half_upload(base, conversation, "big.bin", 4 * MIB)
        try:
            with anyio.fail_after(BOUND):
                await poll(lambda: sum(path.stat().st_size for path in _staged(state_dir)) >= MIB)
            staged = _staged(state_dir)
            async with _server(state_dir, config, sandbox_runtime):
                assert _staged(state_dir) == staged
            await anyio.to_thread.run_sync(cut.sendall, b"p" * (2 * MIB))
            reply = await anyio.to_thread.run_sync(cut.recv, 65536)
            assert b" 201 " in reply.split(b"\r\n", 1)[0], reply[:200]
        finally:
            cut.close()
        with anyio.fail_after(BOUND):
            await poll(lambda: not _staged(state_dir))
    assert _in_workspaces(state_dir)[0].endswith("/big.bin")
    assert (state_dir / "workspaces" / _in_workspaces(state_dir)[0]).stat().st_size == 4 * MIB
