"""A hostile tenant holding the server's connections (issue 21, item 3): the server-wide cap.

One address may hold ``max_connections_per_address`` connections; an attacker with many
addresses (here 127.0.0.60 and up) can still open more in all, until the server-wide cap: half
of the server's open-files limit. The server here starts with a hard limit of
:data:`OPEN_FILES` (set by a ``sitecustomize`` before it starts), so the cap is
``OPEN_FILES // 2`` connections. Past it a connection is answered ``503`` and closed, the refusals
are logged a line per interval (not one per refusal), and once the attacker lets go another
tenant is served.
"""

from __future__ import annotations

import hashlib
import os
import textwrap
import uuid
from pathlib import Path

import anyio
import anyio.abc
import httpx2
import pytest

from mcp_test_helpers import CALL_BOUND, http_client, http_server, structured

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"  # the attacker
BOB = "bob-token-0123456789abcdef0000"  # the victim
OPEN_FILES = 256
CAP = OPEN_FILES // 2  # see server/transport/limits.py: half of the descriptors for connections
PER_ADDRESS = 16
ADDRESSES = 10  # x 15 connections each: 150, past the cap of 128 and under every address's own
ATTEMPTS = 150


def _limited_startup(directory: Path) -> dict[str, str]:
    """The server's environment: a ``sitecustomize`` lowering its RLIMIT_NOFILE to :data:`OPEN_FILES` first.

    (This process cannot lower a limit for its child and raise it back: no CAP_SYS_RESOURCE here.)
    """
    site = directory / f"site-{uuid.uuid4().hex[:8]}"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, ({OPEN_FILES}, {OPEN_FILES}))\n"
    )
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}


def _config(directory: Path) -> Path:
    path = directory / f"cap-{uuid.uuid4().hex[:8]}.toml"
    bob_digest = hashlib.sha256(BOB.encode()).hexdigest()
    path.write_text(
        textwrap.dedent(f"""
        pool_size = 1
        pool_min = 0
        header_timeout = "60s"
        keep_alive_timeout = "60s"
        max_connections_per_address = {PER_ADDRESS}
        [auth]
        tokens = [
          {{ tenant = "alice", token = "{ALICE}" }},
          {{ tenant = "bob", token = "sha256:{bob_digest}" }},
        ]
        """)
    )
    return path


async def _answer(stream: anyio.abc.SocketStream) -> bytes | None:
    """What the server sent before closing ``stream`` (None: it keeps it open and silent for now)."""
    received = b""
    with anyio.move_on_after(2):
        try:
            while True:
                received += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            return received
    return None


async def test_connections_past_the_server_wide_cap_get_503_and_another_tenant_is_served_once_they_close(
    module_state_dir: Path, sandbox_runtime: Path | None
) -> None:
    log = module_state_dir.parent / f"cap-{uuid.uuid4().hex[:8]}.log"
    config = _config(module_state_dir.parent)
    env = _limited_startup(module_state_dir.parent)
    async with http_server(
        module_state_dir, "--config", str(config), env=env, runtime=sandbox_runtime, log_path=log
    ) as base:
        port = int(base.rsplit(":", 1)[1])
        held: list[anyio.abc.SocketStream] = []
        try:
            for index in range(ATTEMPTS):
                address = f"127.0.0.{60 + index % ADDRESSES}"
                held.append(await anyio.connect_tcp("127.0.0.1", port, local_host=address))
            answers = []
            async with anyio.create_task_group() as group:

                async def listen(stream: anyio.abc.SocketStream) -> None:
                    answers.append(await _answer(stream))

                for stream in held:
                    group.start_soon(listen, stream)
            refused = [answer for answer in answers if answer is not None]
            assert len(refused) >= ATTEMPTS - CAP  # at most the cap held open, whatever the addresses
            assert len(refused) < ATTEMPTS
            assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in refused)
            # Bob, from an address of his own, is refused too while the attacker holds them all.
            async with await anyio.connect_tcp("127.0.0.1", port, local_host="127.0.0.90") as bob_stream:
                assert (await _answer(bob_stream) or b"").startswith(b"HTTP/1.1 503 ")
        finally:
            for stream in held:
                await stream.aclose()
        # Let go: the other tenant's run is served (the server sees the closes as they come).
        with anyio.fail_after(CALL_BOUND):
            while True:
                try:
                    async with http_client(base, BOB) as client:
                        data = structured(await client.call_tool("run_python", {"code": "print(6 * 7)"}))
                    break
                except (httpx2.HTTPError, OSError):
                    await anyio.sleep(0.2)
        assert data["stdout"] == "42\n"
    logged = [line for line in log.read_text().splitlines() if "refused a connection" in line]
    assert 1 <= len(logged) <= 3, logged  # one line per 10 s, not one per refusal
