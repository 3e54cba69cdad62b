"""The HTTP service end to end: a real `serve --transport http`, the SDK client, plain HTTP requests.

Two tenants (alice, bob) share one server. Every attack here is made the way a client or
sandboxed code would make it, against the running server.
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult, ImageContent

from mcp_sandbox.server.urls import UrlSigner
from mcp_sandbox.workspace import derive_key, load_secret
from mcp_test_helpers import (
    CALL_BOUND,
    auth_tokens,
    bearer_web,
    host_processes,
    http_client,
    http_server,
    new_conversation,
    poll,
    run_over_http,
    structured,
    text,
    upload,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"
QUOTA = 256 << 10


@pytest.fixture(scope="module")
def config(module_state_dir: Path) -> Path:
    path = module_state_dir.parent / f"http-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(f"quota_bytes = {QUOTA}\nquota_files = 50\n" + auth_tokens({"alice": ALICE}, {"bob": BOB}))
    return path


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None, config: Path) -> AsyncIterator[str]:
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> CallToolResult:
    with anyio.fail_after(CALL_BOUND * 2):
        return await client.call_tool(tool, arguments)


PASSWD = Path("/etc/passwd")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _exists(path: str) -> bool:
    return os.path.lexists(path)


# --- auth ----------------------------------------------------------------------------------


async def test_a_request_without_a_token_gets_401_saying_a_bearer_token_is_required(base: str) -> None:
    async with bearer_web(None) as web:
        refused = await web.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert refused.status_code == 401
    challenge = refused.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert "bearer token required" in challenge
    # Static tokens: no authorization server to point at.
    assert "resource_metadata" not in challenge


@pytest.mark.parametrize("path", ["/mcp", "/sse", "/messages/?session_id=0", "/upload"])
async def test_every_authenticated_route_refuses_a_wrong_token(base: str, path: str) -> None:
    async with bearer_web("not-a-valid-token-at-all-000") as web:
        response = await web.request("GET" if path == "/sse" else "POST", f"{base}{path}", content=b"{}")
    assert response.status_code == 401


async def test_both_tenants_run_code_with_their_tokens_over_streamable_http_and_sse(base: str) -> None:
    for token, transport in ((ALICE, "http"), (BOB, "sse")):
        async with http_client(base, token, transport) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"run_python", "run_code", "upload_file", "list_runners"} <= tools
            result = await call(client, "run_python", {"code": "print(6 * 7)"})
        assert structured(result)["stdout"] == "42\n"


def test_the_server_refuses_to_listen_beyond_loopback_without_a_token(module_state_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
    done = subprocess.run(
        [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--host", "0.0.0.0"],
        env={**env, "MCP_SANDBOX_STATE_DIR": str(module_state_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "without a bearer token" in done.stderr


async def test_a_foreign_origin_or_host_is_refused_against_dns_rebinding(base: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with bearer_web(ALICE) as web:
        origin = await web.post(f"{base}/mcp", json=body, headers={"Origin": "http://evil.example"})
        host = await web.post(f"{base}/mcp", json=body, headers={"Host": "evil.example"})
        upload_origin = await web.post(
            f"{base}/upload?conversationId=x&filename=a", content=b"x", headers={"Origin": "http://evil.example"}
        )
    assert origin.status_code == 403
    assert host.status_code == 421
    assert upload_origin.status_code == 403


async def test_an_oversized_mcp_request_is_refused_with_413(base: str) -> None:
    code = "x = 1\n" + "#" * (5 << 20)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_python", "arguments": {}}}
    body["params"]["arguments"] = {"code": code}  # type: ignore[index]
    async with bearer_web(ALICE) as web:
        response = await web.post(f"{base}/mcp", json=body, headers={"Accept": "application/json, text/event-stream"})
    assert response.status_code == 413


# --- conversations, files, URLs ------------------------------------------------------------


async def test_upload_then_run_then_download_round_trip(base: str) -> None:
    conv = new_conversation()
    uploaded = await upload(base, ALICE, conv, "input/data.csv", b"region,amount\nnorth,3\nsouth,4\n")
    assert uploaded.status_code == 201
    data = await run_over_http(
        base,
        ALICE,
        """
        import csv, os
        rows = list(csv.DictReader(open("/workspace/input/data.csv")))
        total = sum(int(r["amount"]) for r in rows)
        open("/data/total.txt", "w").write(f"total={total}\\n")
        print(os.environ["FILE_BASE_URL"].startswith("http"))
        """,
        conversationId=conv,
    )
    assert data["status"] == "success", data
    assert data["stdout"] == "True\n"
    files = {f["name"]: f for f in data["files"]}
    assert set(files) == {"input/data.csv", "total.txt"}
    async with bearer_web(None) as web:  # a signed URL needs no token
        download = await web.get(files["total.txt"]["url"])
        ranged = await web.get(files["input/data.csv"]["url"], headers={"Range": "bytes=7-12"})
        head = await web.head(files["total.txt"]["url"])
    assert download.status_code == 200
    assert download.content == b"total=7\n"
    assert download.headers["content-type"].startswith("text/plain")
    assert "total.txt" in download.headers["content-disposition"]
    assert download.headers["x-content-type-options"] == "nosniff"
    assert ranged.status_code == 206
    assert ranged.content == b"amount"
    assert ranged.headers["content-range"] == f"bytes 7-12/{files['input/data.csv']['size']}"
    assert head.status_code == 200 and head.headers["content-length"] == "8"


async def test_a_multipart_upload_stores_every_file_part(base: str) -> None:
    conv = new_conversation()
    async with bearer_web(ALICE) as web:
        response = await web.post(
            f"{base}/upload",
            data={"conversationId": conv},
            files=[("file", ("a.txt", b"alpha")), ("file", ("b.bin", b"\x00\x01"))],
        )
    assert response.status_code == 201, response.text
    assert sorted(f["name"] for f in response.json()["files"]) == ["a.txt", "b.bin"]
    data = await run_over_http(base, ALICE, "print(open('/workspace/a.txt').read())", conversationId=conv)
    assert data["stdout"] == "alpha\n"


async def test_upload_file_tool_stores_base64_content_for_the_next_run(base: str) -> None:
    conv = new_conversation()
    async with http_client(base, ALICE) as client:
        stored = await call(
            client,
            "upload_file",
            {"conversationId": conv, "filename": "n.txt", "content": base64.b64encode(b"41").decode()},
        )
        assert not stored.is_error, text(stored)
        result = await call(
            client, "run_python", {"code": "print(int(open('n.txt').read()) + 1)", "conversationId": conv}
        )
    assert structured(stored)["size"] == 2
    assert structured(result)["stdout"] == "42\n"


async def test_a_tenant_never_reaches_another_tenants_conversation_with_the_same_id(base: str) -> None:
    conv = new_conversation()
    assert (await upload(base, ALICE, conv, "secret.txt", b"alice only")).status_code == 201
    data = await run_over_http(
        base,
        BOB,
        """
        import os, urllib.request
        print(sorted(os.listdir("/workspace")))
        print(os.environ["FILE_BASE_URL"])
        """,
        conversationId=conv,
    )
    listed, bob_base = data["stdout"].splitlines()
    assert listed == "[]"
    async with bearer_web(None) as web:
        assert (await web.get(f"{bob_base}/secret.txt")).status_code == 404


async def test_expired_and_tampered_download_urls_are_refused(base: str, module_state_dir: Path) -> None:
    conv = new_conversation()
    url = (await upload(base, ALICE, conv, "f.txt", b"content")).json()["files"][0]["url"]
    prefix, _, name = url.rpartition("/")
    key, expires, signature = prefix.split("/")[-3:]
    # Signed with the server's real key, but a minute in the past: only the expiry is wrong.
    signer = UrlSigner(derive_key(load_secret(module_state_dir), "download-url"), base, ttl=-60)
    expired = signer.file_url(key, "f.txt", now=time.time())
    flipped = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    async with bearer_web(None) as web:
        assert (await web.get(url)).status_code == 200
        assert (await web.get(expired)).status_code == 410
        assert (await web.get(f"{prefix.rsplit('/', 1)[0]}/{flipped}/{name}")).status_code == 403
        assert (await web.get(f"{prefix}/other.txt")).status_code == 403  # a file URL covers one file
        assert (await web.get(url.replace(f"/{expires}/", f"/{int(expires) + 3600}/"))).status_code == 403
        assert (await web.get(f"{prefix.rsplit('/', 3)[0]}/")).status_code == 404  # no listing


async def test_symlinks_fifos_and_traversal_made_by_sandboxed_code_are_never_followed(base: str) -> None:
    conv = new_conversation()
    before = _digest(PASSWD)
    data = await run_over_http(
        base,
        ALICE,
        """
        import os
        os.symlink("/etc/passwd", "/workspace/link.txt")
        os.symlink("/etc", "/workspace/etcdir")
        os.mkfifo("/workspace/fifo.csv")
        open("/workspace/plain.txt", "w").write("ok")
        print(os.environ["FILE_BASE_URL"])
        """,
        conversationId=conv,
    )
    assert data["status"] == "success", data
    assert [f["name"] for f in data["files"]] == ["plain.txt"]
    file_base = data["stdout"].strip()
    async with bearer_web(None) as web:
        with anyio.fail_after(30):  # a FIFO must not block the server
            for name in ("link.txt", "etcdir/passwd", "fifo.csv", "../../secret", "%2e%2e/%2e%2e/etc/passwd"):
                assert (await web.get(f"{file_base}/{name}")).status_code in (403, 404), name
        assert (await web.get(f"{file_base}/plain.txt")).content == b"ok"
    for name in ("../x", "/etc/x", "a/../../x", "etcdir/evil", "fifo.csv/x"):
        refused = await upload(base, ALICE, conv, name, b"evil")
        assert refused.status_code in (400, 409), (name, refused.text)
    assert not _exists("/etc/evil")
    # Uploading over the symlink replaces the link itself, never the file it points to.
    assert (await upload(base, ALICE, conv, "link.txt", b"replaced")).status_code == 201
    assert _digest(PASSWD) == before


async def test_a_full_quota_refuses_the_upload_and_keeps_what_was_stored(base: str) -> None:
    conv = new_conversation()
    assert (await upload(base, ALICE, conv, "keep.bin", b"k" * (QUOTA // 2))).status_code == 201
    too_big = await upload(base, ALICE, conv, "big.bin", b"b" * (QUOTA // 2 + 1024))
    assert too_big.status_code == 413
    assert (await upload(base, ALICE, conv, "keep.bin", b"x" * (QUOTA + 1))).status_code == 413
    async with http_client(base, ALICE) as client:
        refused = await call(
            client,
            "upload_file",
            {"conversationId": conv, "filename": "big.bin", "content": base64.b64encode(b"b" * QUOTA).decode()},
        )
        assert refused.is_error
        data = structured(
            await call(
                client,
                "run_python",
                {"code": "import os; print(sorted(os.listdir()), os.path.getsize('keep.bin'))", "conversationId": conv},
            )
        )
    assert data["stdout"] == f"['keep.bin'] {QUOTA // 2}\n"


# --- sessions ------------------------------------------------------------------------------


async def test_a_conversation_keeps_its_variables_between_runs_until_reset(base: str) -> None:
    conv = new_conversation()
    async with http_client(base, ALICE) as client:
        first = structured(await call(client, "run_python", {"code": "import math\nx = 41", "conversationId": conv}))
        second = structured(
            await call(client, "run_python", {"code": "print(x + 1, math.pi > 3)", "conversationId": conv})
        )
        reset = structured(
            await call(client, "run_python", {"code": "print('x' in dir())", "conversationId": conv, "reset": True})
        )
        other = structured(await call(client, "run_python", {"code": "print('x' in dir())"}))
    assert first["session"] == "new"
    assert (second["session"], second["stdout"]) == ("kept", "42 True\n")
    assert (reset["session"], reset["stdout"]) == ("new", "False\n")
    assert "session" not in other and other["stdout"] == "False\n"


async def test_images_shown_with_matplotlib_come_back_as_image_content(base: str) -> None:
    async with http_client(base, ALICE) as client:
        result = await call(
            client,
            "run_python",
            {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"},
        )
    images = [block for block in result.content if isinstance(block, ImageContent)]
    assert len(images) == 1
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")


# --- the service's own state ---------------------------------------------------------------


@pytest.mark.slow
async def test_restart_keeps_files_and_metadata_and_retention_evicts_the_least_recently_used(
    state_dir: Path, sandbox_runtime: Path | None, config: Path
) -> None:
    async with http_server(state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        assert (await upload(url, ALICE, "old", "a.bin", b"a" * 100_000)).status_code == 201
        assert (await upload(url, ALICE, "new", "b.bin", b"b" * 100_000)).status_code == 201
        secret_env = {"environment": {"API_KEY": "sk-live-do-not-store"}}
        async with http_client(url, ALICE) as client:
            await call(client, "run_code", {"code": "print('SECRET-CODE-MARKER')", "language": "python", **secret_env})
    async with http_server(state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        data = await run_over_http(url, ALICE, "import os; print(os.listdir())", conversationId="new")
        assert data["stdout"] == "['b.bin']\n"
    # Both conversations now hold 100 kB; a total of 150 kB leaves room for the newest only.
    env = {"MCP_SANDBOX_MAX_WORKSPACES_BYTES": "150000"}
    async with http_server(state_dir, "--config", str(config), env=env, runtime=sandbox_runtime) as url:
        old = await run_over_http(url, ALICE, "import os; print(os.listdir())", conversationId="old")
        new = await run_over_http(url, ALICE, "import os; print(os.listdir())", conversationId="new")
    assert old["stdout"] == "[]\n"
    assert new["stdout"] == "['b.bin']\n"
    with sqlite3.connect(state_dir / "metadata.sqlite3") as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        dump = "\n".join(str(row) for table in tables for row in db.execute(f'SELECT * FROM "{table}"'))
        executions = db.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    assert executions >= 4
    for secret in ("SECRET-CODE-MARKER", "sk-live-do-not-store", ALICE, "'old'", "'new'"):
        assert secret not in dump


def _exited(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (our child until the helper reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _server_pids(state_dir: Path) -> list[int]:
    """The `mcp-sandbox serve` processes this test started on ``state_dir`` (not their sandboxes).

    Only our own children count: a child the server is forking (a pre-started sandbox, right after
    start-up) shows the server's command line until it execs.
    """
    found = []
    for pid in host_processes(str(state_dir)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        if b"mcp_sandbox" in argv and b"serve" in argv and parent == os.getpid():
            found.append(pid)
    return found


@pytest.mark.slow
async def test_sigterm_stops_the_server_and_kills_a_running_sandbox(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    env = {"MCP_SANDBOX_SHUTDOWN_GRACE": "1"}
    outcome: list[str] = []
    async with http_server(state_dir, env=env, runtime=sandbox_runtime) as url:
        (server,) = _server_pids(state_dir)

        # bwrap's argv names no host path (its options travel through a descriptor): the run's own
        # process carries a marker instead.
        marker = f"sigterm-{uuid.uuid4().hex}"

        def sandboxes() -> list[int]:
            return [pid for pid in host_processes(marker) if pid != server]

        async def long_run() -> None:
            code = f"import subprocess\nsubprocess.run([{marker!r}, '300'], executable='/bin/sleep')"
            try:
                async with http_client(url, None) as client:
                    await call(client, "run_python", {"code": code})
                outcome.append("returned")
            except Exception as exc:  # the connection drops with the server; the SDK decides how it says so
                outcome.append(type(exc).__name__)

        async with anyio.create_task_group() as group:
            group.start_soon(long_run)
            with anyio.fail_after(60):
                await poll(lambda: bool(sandboxes()))
            os.kill(server, signal.SIGTERM)
            with anyio.fail_after(30):
                await poll(lambda: _exited(server))
            assert not [pid for pid in sandboxes() if not _exited(pid)]  # the sandbox went with the server
            with anyio.fail_after(30):
                await poll(lambda: bool(outcome))
