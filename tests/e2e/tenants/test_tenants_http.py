"""A hostile tenant against the HTTP service (issue 21, items 2, 3, 4, 5, 7, 11): every attack is
made as a client would make it, against a real `serve --transport http` with two tenants, and
each test checks that the other tenant is still served and that the attack was bounded.

Limits are lowered in the server's config so the attacks stay small (a few dozen connections, a
few MiB of disk). Slow clients are raw sockets that send a byte at a time, bound to addresses of
their own in 127.0.0.0/8 (the per-address connection cap counts them apart from the victim's).
"""

from __future__ import annotations

import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest

from mcp_sandbox.server.transport.limits import MAX_HEAD_BYTES
from mcp_test_helpers import (
    auth_tokens,
    bearer_web,
    host_processes,
    http_server,
    new_conversation,
    run_over_http,
    upload,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"  # the attacker
BOB = "bob-token-0123456789abcdef0000"  # the victim
QUOTA = 1 << 20
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
PER_ADDRESS = 12
HTTP_SESSIONS = 4
SESSION_TTL = 8  # long enough that a loaded machine opens the quota's sessions before any expires
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def config(module_state_dir: Path) -> Path:
    path = module_state_dir.parent / f"tenants-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(
        textwrap.dedent(f"""
        quota_bytes = {QUOTA}
        quota_files = 50
        pool_size = 2
        pool_min = 1
        pool_preload = []
        max_concurrent_runs = 2
        tenant_concurrent_runs = 1
        tenant_queued_runs = 2
        queue_timeout = "60s"
        max_sessions = 4
        tenant_sessions = 2
        tenant_workspaces_bytes = "3m"
        retention_interval = "1s"
        tenant_http_sessions = {HTTP_SESSIONS}
        http_session_ttl = "{SESSION_TTL}s"
        header_timeout = "{HEADER_TIMEOUT}s"
        keep_alive_timeout = "2s"
        max_connections_per_address = {PER_ADDRESS}
        body_timeout = "{BODY_TIMEOUT}s"
        tenant_uploads = 16
        upload_workers = 4
        """)
        + auth_tokens({"alice": ALICE}, {"bob": BOB})
    )
    return path


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None, config: Path) -> AsyncIterator[str]:
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def connect_from(base: str, address: str) -> anyio.abc.SocketStream:
    return await anyio.connect_tcp("127.0.0.1", _port(base), local_host=address)


_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionResetError, BrokenPipeError)


async def read_until_closed(stream: anyio.abc.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    received = b""
    try:
        while True:
            received += await stream.receive()
    except (anyio.EndOfStream, *_GONE):
        return received


# --- 3. connections are timed out and capped per address -------------------------------------


async def trickle(stream: anyio.abc.SocketStream, data: bytes, sent: list[int]) -> None:
    """Send ``data`` a byte every 50 ms until it is all sent or the server closes the connection."""
    try:
        for byte in data:
            await stream.send(bytes([byte]))
            sent[0] += 1
            await anyio.sleep(0.05)
    except _GONE:
        return


async def test_a_slowloris_sending_headers_a_byte_at_a_time_is_cut_at_the_header_timeout(base: str) -> None:
    request = b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 400  # 20 s at this pace
    sent = [0]
    started = time.monotonic()
    async with await connect_from(base, "127.0.0.20") as stream, anyio.create_task_group() as group:
        group.start_soon(trickle, stream, request, sent)
        with anyio.fail_after(HEADER_TIMEOUT + 10):
            answer = await read_until_closed(stream)
        group.cancel_scope.cancel()
    assert answer == b""
    assert sent[0] < len(request)
    assert time.monotonic() - started < HEADER_TIMEOUT + 5


async def test_a_request_head_past_its_bound_is_answered_431_and_the_connection_closed(base: str) -> None:
    # Headers never ended, a little past the bound: the parser would buffer a header whole, unbounded.
    head = b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Big: " + b"a" * (MAX_HEAD_BYTES + 1024)
    async with await connect_from(base, "127.0.0.21") as stream:
        await stream.send(head)
        with anyio.fail_after(HEADER_TIMEOUT + 10):
            answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert str(MAX_HEAD_BYTES).encode() in answer
    # Many small headers count alike; a head within the bound is served.
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 60) for i in range(MAX_HEAD_BYTES // 64 + 10))
    async with await connect_from(base, "127.0.0.21") as stream:
        await stream.send(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many)
        with anyio.fail_after(HEADER_TIMEOUT + 10):
            answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 431 ")
    # A whole head past the bound in one read: refused before the request reaches the app.
    whole = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many + b"\r\n"
    async with await connect_from(base, "127.0.0.21") as stream:
        await stream.send(whole)
        with anyio.fail_after(HEADER_TIMEOUT + 10):
            answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 431 ") and answer.count(b"HTTP/1.1") == 1
    async with bearer_web(BOB) as web:
        within = {f"X-H{i}": "b" * 60 for i in range(100)}
        assert (await web.get(f"{base}/healthz", headers=within)).status_code == 200


async def test_an_idle_connection_is_closed_and_a_half_sent_one_too(base: str) -> None:
    async with await connect_from(base, "127.0.0.21") as idle, await connect_from(base, "127.0.0.21") as half:
        await half.send(b"POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        with anyio.fail_after(HEADER_TIMEOUT + 5):
            assert await read_until_closed(idle) == b""
            assert await read_until_closed(half) == b""


async def test_one_address_cannot_hold_more_than_its_connections_and_the_other_tenant_is_served(base: str) -> None:
    held = [await connect_from(base, "127.0.0.22") for _ in range(PER_ADDRESS)]
    try:
        async with await connect_from(base, "127.0.0.22") as extra:
            with anyio.fail_after(10):
                refused = await read_until_closed(extra)
        assert refused.startswith(b"HTTP/1.1 429 ")
        data = await run_over_http(base, BOB, "print(6 * 7)")
        assert data["stdout"] == "42\n"
    finally:
        for stream in held:
            await stream.aclose()


def _server_open_files_limits(state_dir: Path) -> list[tuple[str, str]]:
    """(soft, hard) RLIMIT_NOFILE of each `serve` process using ``state_dir``."""
    found = []
    for pid in host_processes(str(state_dir)):
        try:  # a child the server forks shows its command line until it execs, then may be gone
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
        except OSError:
            continue
        if b"serve" not in argv:
            continue
        line = next(x for x in limits if x.startswith("Max open files"))
        soft, hard = line.split()[3:5]
        found.append((soft, hard))
    return found


async def test_the_running_server_has_its_open_files_limit_raised_to_the_hard_limit(
    base: str, module_state_dir: Path
) -> None:
    limits = _server_open_files_limits(module_state_dir)
    assert limits
    for soft, hard in limits:
        assert soft == hard


def test_raising_the_open_files_limit_lifts_a_low_soft_limit_to_the_hard_one() -> None:
    import resource
    import subprocess
    import sys

    code = (
        "import resource\n"
        "from mcp_sandbox.server.transport.limits import raise_open_files_limit\n"
        "soft = raise_open_files_limit()\n"
        "print(soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1])\n"
    )
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    done = subprocess.run(
        [sys.executable, "-c", code], preexec_fn=lower, capture_output=True, text=True, check=True, timeout=60
    )
    soft_after, hard_after = done.stdout.split()
    assert soft_after == hard_after != "256"


# --- 2. slow uploads freeze no one -----------------------------------------------------------


# Small enough that the 16 uploads a tenant may stream at once fit in the quota together: none is
# refused 413, which would free its upload slot at once for a later connection (the quota's own
# race is test 5's).
_SLOW_UPLOAD = 60_000
assert 16 * _SLOW_UPLOAD <= QUOTA


async def _slow_upload(base: str, address: str, conv: str, results: list[bytes]) -> None:
    async with await connect_from(base, address) as stream:
        await stream.send(
            f"POST /upload?conversationId={conv}&filename=slow.bin HTTP/1.1\r\nHost: 127.0.0.1:{_port(base)}\r\n"
            f"Authorization: Bearer {ALICE}\r\nContent-Length: {_SLOW_UPLOAD}\r\n\r\n".encode()
        )
        answer = b""
        with anyio.move_on_after(BODY_TIMEOUT + HEADER_TIMEOUT + 20):
            async with anyio.create_task_group() as group:
                group.start_soon(trickle, stream, b"x" * _SLOW_UPLOAD, [0])
                answer = await read_until_closed(stream)
                group.cancel_scope.cancel()
        results.append(answer)


async def test_forty_uploads_sent_a_byte_at_a_time_are_refused_or_cut_and_the_other_tenant_runs(base: str) -> None:
    conv = new_conversation()
    results: list[bytes] = []
    started = time.monotonic()
    async with anyio.create_task_group() as group:
        for index in range(40):
            group.start_soon(_slow_upload, base, f"127.0.0.{30 + index // 10}", conv, results)
        await anyio.sleep(0.5)
        # The other tenant's runs get threads and slots while all of that goes on.
        with anyio.fail_after(30):
            data = await run_over_http(base, BOB, "print(6 * 7)")
        assert data["status"] == "success", data
        assert data["stdout"] == "42\n"
    statuses = sorted(answer.split(b" ", 2)[1].decode() if answer else "closed" for answer in results)
    assert len(statuses) == 40
    # At most tenant_uploads (16) streamed, and were cut (408); the rest were told 429 at once.
    assert statuses.count("408") <= 16, statuses
    assert statuses.count("429") >= 24, statuses
    assert set(statuses) <= {"408", "429"}, statuses
    assert time.monotonic() - started < BODY_TIMEOUT + HEADER_TIMEOUT + 25
    # Nothing of the cut uploads was stored.
    listing = await run_over_http(base, ALICE, "import os; print(os.listdir())", conversationId=conv)
    assert listing["stdout"] == "[]\n"


# --- 5. concurrent uploads cannot pass the quota together ------------------------------------


async def test_sixteen_concurrent_uploads_into_one_conversation_cannot_pass_its_quota(base: str) -> None:
    conv = new_conversation()
    statuses: list[int] = []

    async def one(index: int) -> None:
        address = f"127.0.0.{40 + index % 2}"  # 8 connections from each: under the per-address cap
        response = await upload(base, ALICE, conv, f"part-{index}.bin", b"q" * (900 << 10), address)
        statuses.append(response.status_code)

    async with anyio.create_task_group() as group:
        for index in range(16):
            group.start_soon(one, index)
    assert statuses.count(201) == 1, statuses
    assert set(statuses) == {201, 413}, statuses
    data = await run_over_http(base, ALICE, "print(1)", conversationId=conv)
    assert sum(entry["size"] for entry in data["files"]) <= QUOTA


# --- 4. MCP sessions over HTTP: a quota per tenant, bound to it ------------------------------


async def _open_session(web: httpx2.AsyncClient, base: str) -> httpx2.Response:
    return await web.post(f"{base}/mcp", json=INIT, headers=MCP_HEADERS)


async def _close_session(web: httpx2.AsyncClient, base: str, opened: httpx2.Response) -> None:
    await web.delete(f"{base}/mcp", headers={**MCP_HEADERS, "mcp-session-id": opened.headers["mcp-session-id"]})


async def _open_quota(web: httpx2.AsyncClient, base: str) -> list[httpx2.Response]:
    """The tenant's whole quota of sessions, opened once the ones earlier tests left have expired.

    A client of an earlier test that gave up on a loaded machine sends no DELETE: its session
    lives until ``http_session_ttl``. Until then the quota is not all free; past that it must be
    (a quota smaller than configured, or sessions that never expire, fail here).
    """
    with anyio.fail_after(SESSION_TTL + 30):
        while True:
            opened = [await _open_session(web, base) for _ in range(HTTP_SESSIONS)]
            if all(response.status_code == 200 for response in opened):
                return opened
            assert {response.status_code for response in opened} <= {200, 429}, opened
            for response in opened:
                if response.status_code == 200:
                    await _close_session(web, base, response)
            await anyio.sleep(0.5)


async def test_a_tenant_at_its_session_quota_is_refused_429_and_the_other_tenant_opens_sessions(base: str) -> None:
    # Addresses of their own: connections the attacks above left closing count against 127.0.0.1's cap.
    async with bearer_web(ALICE, "127.0.0.50") as alice, bearer_web(BOB, "127.0.0.51") as bob:
        opened = await _open_quota(alice, base)
        refused = await _open_session(alice, base)
        assert refused.status_code == 429
        assert "tenant_http_sessions" in refused.json()["error"]["message"]
        # SSE sessions count against the same quota.
        sse = await alice.get(f"{base}/sse")
        assert sse.status_code == 429
        # The other tenant is not affected.
        assert (await _open_session(bob, base)).status_code == 200
        # Closing one gives the room back.
        first = opened[0].headers["mcp-session-id"]
        closed = await alice.delete(f"{base}/mcp", headers={**MCP_HEADERS, "mcp-session-id": first})
        assert closed.status_code < 300
        reopened = await _open_session(alice, base)
        assert reopened.status_code == 200
        for response in [*opened[1:], reopened]:
            await _close_session(alice, base, response)


async def test_concurrent_opening_requests_cannot_pass_the_session_quota_together(base: str) -> None:
    statuses: list[int] = []
    sessions: list[str] = []
    async with bearer_web(ALICE, "127.0.0.50") as alice:

        async def one() -> None:
            response = await _open_session(alice, base)
            statuses.append(response.status_code)
            if response.status_code == 200:
                sessions.append(response.headers["mcp-session-id"])

        async with anyio.create_task_group() as group:
            for _ in range(10):
                group.start_soon(one)
        for session in sessions:
            await alice.delete(f"{base}/mcp", headers={**MCP_HEADERS, "mcp-session-id": session})
    assert 1 <= statuses.count(200) <= HTTP_SESSIONS, statuses
    assert set(statuses) <= {200, 429}, statuses


@pytest.mark.slow
async def test_an_idle_session_expires_and_gives_its_room_back(base: str) -> None:
    async with bearer_web(ALICE, "127.0.0.52") as alice:
        opened = await _open_quota(alice, base)
        assert (await _open_session(alice, base)).status_code == 429
        # Nothing touches the open sessions: after http_session_ttl they expire and make room.
        with anyio.fail_after(SESSION_TTL + 20):
            while (reopened := await _open_session(alice, base)).status_code == 429:  # noqa: ASYNC110
                await anyio.sleep(0.5)
        assert reopened.status_code == 200
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        expired = await alice.post(
            f"{base}/mcp", json=ping, headers={**MCP_HEADERS, "mcp-session-id": opened[0].headers["mcp-session-id"]}
        )
        assert expired.status_code == 404
        await alice.delete(f"{base}/mcp", headers={**MCP_HEADERS, "mcp-session-id": reopened.headers["mcp-session-id"]})


@pytest.mark.slow
async def test_an_idle_sse_session_is_ended_after_the_session_ttl(base: str) -> None:
    started = time.monotonic()
    async with bearer_web(BOB) as bob, bob.stream("GET", f"{base}/sse") as events:
        assert events.status_code == 200
        with anyio.fail_after(SESSION_TTL + 20):
            async for _ in events.aiter_lines():  # the endpoint event, pings; then the server ends it
                pass
    assert time.monotonic() - started >= SESSION_TTL - 1


@pytest.mark.slow
async def test_an_sse_session_that_posts_messages_outlives_the_session_ttl(base: str) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with bearer_web(BOB) as bob, bob.stream("GET", f"{base}/sse") as events:
        lines = events.aiter_lines()
        endpoint = ""
        with anyio.fail_after(10):
            async for line in lines:
                if line.startswith("data:") and "session_id=" in line:
                    endpoint = line.removeprefix("data:").strip()
                    break
        for _ in range(2 * SESSION_TTL):
            assert (await bob.post(f"{base}{endpoint}", json=ping)).status_code == 202
            await anyio.sleep(0.5)
        assert (await bob.post(f"{base}{endpoint}", json=ping)).status_code == 202


async def test_a_tenant_cannot_use_another_tenants_sse_or_streamable_http_session(base: str) -> None:
    async with bearer_web(BOB) as bob, bearer_web(ALICE) as alice:
        session = (await _open_session(bob, base)).headers["mcp-session-id"]
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        stolen = await alice.post(f"{base}/mcp", json=ping, headers={**MCP_HEADERS, "mcp-session-id": session})
        assert stolen.status_code == 404
        async with bob.stream("GET", f"{base}/sse") as events:
            endpoint = ""
            with anyio.fail_after(10):
                async for line in events.aiter_lines():
                    if line.startswith("data:") and "session_id=" in line:
                        endpoint = line.removeprefix("data:").strip()
                        break
            posted = await alice.post(f"{base}{endpoint}", json=ping)
            assert posted.status_code == 404
        await bob.delete(f"{base}/mcp", headers={**MCP_HEADERS, "mcp-session-id": session})


# --- 11. fairness: caps per tenant, a round-robin queue --------------------------------------


@pytest.mark.slow
async def test_one_tenants_long_runs_neither_make_the_other_busy_nor_queue_without_bound(base: str) -> None:
    results: list[dict[str, Any]] = []

    async def long_run() -> None:
        results.append(await run_over_http(base, ALICE, "import time; time.sleep(6); print('slept')"))

    async with anyio.create_task_group() as group:
        for _ in range(4):  # one runs (tenant_concurrent_runs), two wait (tenant_queued_runs), one is refused
            group.start_soon(long_run)
        await anyio.sleep(1.5)
        started = time.monotonic()
        data = await run_over_http(base, BOB, "print(6 * 7)")
        bob_seconds = time.monotonic() - started
        assert data["status"] == "success", data
    busy = [result for result in results if result["status"] == "error" and result["error"].startswith("busy:")]
    assert len(busy) == 1, results
    assert "tenant" in busy[0]["error"]
    assert sum(result["stdout"] == "slept\n" for result in results) == 3
    # Bob did not wait for Alice's runs (each sleeps 6 s): a free slot was his at once.
    assert bob_seconds < 6, bob_seconds


async def test_one_tenant_opening_many_conversations_never_evicts_another_tenants_session(base: str) -> None:
    bobs = new_conversation()
    first = await run_over_http(base, BOB, "x = 41", conversationId=bobs)
    assert first["session"] == "new"
    for _ in range(5):  # more than tenant_sessions (2) and max_sessions (4)
        data = await run_over_http(base, ALICE, "y = 1", conversationId=new_conversation())
        assert data["status"] == "success", data
    again = await run_over_http(base, BOB, "print(x + 1)", conversationId=bobs)
    assert again["session"] == "kept", again
    assert again["stdout"] == "42\n"


# --- 7. retention evicts inside the tenant that went over ------------------------------------


async def test_a_tenant_filling_its_conversations_has_its_own_evicted_never_another_tenants(base: str) -> None:
    bobs = await upload(base, BOB, new_conversation(), "keep.bin", b"b" * (512 << 10))
    assert bobs.status_code == 201
    urls = []
    for _ in range(5):  # 4.5 MiB, over alice's 3 MiB budget (each conversation within its quota)
        response = await upload(base, ALICE, new_conversation(), "fill.bin", b"a" * (900 << 10))
        assert response.status_code == 201
        urls.append(response.json()["files"][0]["url"])
    bob_url = bobs.json()["files"][0]["url"]
    async with httpx2.AsyncClient(timeout=30) as web:
        with anyio.fail_after(30):  # retention sweeps every second in this server
            while (await web.get(urls[0])).status_code != 404:  # noqa: ASYNC110 - nothing to wait on but HTTP
                await anyio.sleep(0.2)
        assert (await web.get(bob_url)).status_code == 200
        assert (await web.get(urls[-1])).status_code == 200
